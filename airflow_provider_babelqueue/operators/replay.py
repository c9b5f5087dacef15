"""BabelQueueReplayOperator: replay dead letters (from a DLQ or a replay-set file) once, on any broker.

The engine (selection, ledger, batching: :mod:`airflow_provider_babelqueue.replay`) is Airflow-free; this
operator resolves connections, lists object-storage replay sets through ``ObjectStoragePath`` and feeds it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from typing import IO, TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, Context

from ..bindings.base import Binding
from ..engine import replay as engine
from ..engine.logs import Log
from ..engine.replay import (
    BYPASS_HEADER,
    FileList,
    Item,
    Replayer,
    Selection,
    copy_digest,
    feed_from_browse,
    feed_from_dead_letters,
    skip_part,
)
from ..hooks import DEFAULT_CONN_ID, get_hook
from ..observability import metrics

if TYPE_CHECKING:
    from airflow.sdk import ObjectStoragePath

from ._params import is_template, is_unset, parse_count, parse_flag, parse_names, parse_number, text_or_none

__all__ = ["BYPASS_HEADER", "BabelQueueReplayOperator", "Replayer", "Selection", "copy_digest", "iter_replay_set"]


def object_storage_files(replay_set: str) -> FileList:
    """Files of a replay set given as a URL (``file://``, ``s3://``...): one object, or every object under a
    prefix (sorted; ``_SUCCESS``, hidden and ``.crc`` entries skipped)."""
    from airflow.sdk import ObjectStoragePath

    path = ObjectStoragePath(replay_set)
    if path.is_dir():
        files = sorted((p for p in path.rglob("*")
                        if p.is_file() and not any(skip_part(x) for x in p.relative_to(path).parts)), key=str)
        return [(str(p), _opener(p)) for p in files]
    if not path.exists():
        raise FileNotFoundError(f"replay set {replay_set} does not exist")
    return [(str(path), _opener(path))]


def _opener(path: ObjectStoragePath) -> Callable[[], IO[bytes]]:
    """A function that opens ``path`` for reading when a feed gets to it (not before)."""
    return lambda: path.open("rb")


def iter_replay_set(replay_set: str, log: Log | None = None,
                    ) -> Iterator[Item | str]:
    """:func:`airflow_provider_babelqueue.replay.iter_replay_set`, with URLs read through ``ObjectStoragePath``."""
    return engine.iter_replay_set(replay_set, log, url_files=object_storage_files)


def _check_source(queue_name: Any, replay_set: Any) -> None:
    """Exactly one source. Templated values are only known after rendering, so they pass here."""
    if is_template(queue_name) or is_template(replay_set):
        return
    if is_unset(queue_name) == is_unset(replay_set):
        raise ValueError("give either queue_name (a DLQ to redrive) or replay_set (a file or folder), not both "
                         "and not neither")


def _check_rate(rate: Any) -> None:
    if rate is None or is_template(rate):
        return
    if isinstance(rate, str) or not rate > 0:
        raise ValueError(f"max_messages_per_second must be positive or None, got {rate!r}")


class BabelQueueReplayOperator(BaseOperator):
    """Replay dead letters exactly once per ledger: reset them and publish them to their queue again.

    Input is either a dead-letter queue (``queue_name`` on ``source_conn_id``: a redrive) or a replay set
    (``replay_set``: JSON Lines files of drain records or of envelopes, e.g. a drain's file or a Spark
    triage job's output). Each message is reset (``dead_letter`` removed, ``attempts`` 0, ``meta.id``,
    ``trace_id`` and unknown keys kept) and published to ``target_queue_name``, else
    ``dead_letter.original_queue``, else ``meta.queue``. Poison (undecodable) bodies and envelopes that fail
    validation are never replayed: they are counted and stay in the DLQ. A ledger of replayed ``meta.id``
    values makes re-runs publish nothing twice. Returns ``{"replayed", "skipped", "duplicates_avoided",
    "duplicates_kept", "dry_run", "targets"}`` (XCom).

    :param source_conn_id: the connection of the DLQ to redrive (templated); with ``replay_set`` it is only
        the default target connection.
    :param queue_name: the logical queue whose DLQ is redriven (templated). Mutually exclusive with
        ``replay_set``; a value that renders blank counts as not given, so one DAG can offer both.
    :param replay_set: a JSON Lines file or folder, local or any ``ObjectStoragePath`` URL (templated, e.g.
        the ``path`` a drain returned). Lines are drain records (detected by their ``v`` and ``body`` keys)
        or envelope objects; unusable lines (such as a torn last line) are counted as ``unreadable_line``.
    :param target_conn_id: publish on this connection instead (templated; another broker is fine, e.g. SQL
        to Redis); defaults to ``source_conn_id``.
    :param target_queue_name: publish every message to this queue (templated) instead of its original one.
    :param reasons: replay only dead letters with one of these ``dead_letter.reason`` values (templated); one
        without a ``dead_letter`` block counts as ``unannotated``, as in the Spark triage.
    :param urns: replay only these message URNs (templated).
    :param exception_types: replay only these ``dead_letter.exception`` types, full or last segment
        (templated).
    :param original_queues: replay only messages whose ``dead_letter.original_queue`` (else ``meta.queue``, else
        the queue a drain record was drained from) is one of these (templated).
    :param min_age_seconds: replay only dead letters that failed at least this long ago (by
        ``dead_letter.failed_at``; templated), e.g. to let a fix deploy first.
    :param max_age_seconds: replay only dead letters that failed at most this long ago (templated).
    :param max_attempts: replay only dead letters whose attempts (``dead_letter.attempts``, else ``attempts``)
        are at most this (templated), e.g. to leave the ones that failed many times for a person to look at.
    :param max_messages: replay at most this many messages in this run (templated).
    :param dry_run: report what would be replayed and publish, remember and ack nothing (templated). A DLQ
        source is browsed where the broker can; otherwise its messages are reserved and released back
        unchanged at the end (Redis puts them at the tail of the DLQ).
    :param replay_bypass_header: publish with the header ``bq-replay-bypass: 1`` so consumers can let replays
        through; on brokers that carry no headers it is ignored with one log line.
    :param ledger_conn_id: where the ledger lives (a SQL or Redis connection; templated); defaults to the
        target connection, so a replay and its ledger share a broker.
    :param ledger_name: the ledger's name (templated); default ``replay:<target queue>``. A new name starts a
        fresh ledger (everything becomes replayable again).
    :param max_messages_per_second: publish at most this many messages per second (``None`` = unlimited;
        templated), to spare a downstream that just recovered. The operator sleeps; it never busy-waits.
    :param reserve_timeout: seconds to wait for the next dead letter before the DLQ counts as empty.
    :param batch_size: messages per native batch publish (smaller under a rate limit).
    :param progress_every: log a progress line every this many replayed messages.
    """

    template_fields: Sequence[str] = (
        "source_conn_id", "queue_name", "replay_set", "target_conn_id", "target_queue_name", "reasons", "urns",
        "exception_types", "original_queues", "min_age_seconds", "max_age_seconds", "max_attempts", "max_messages",
        "replay_dry_run",
        "ledger_conn_id", "ledger_name", "max_messages_per_second",
    )
    ui_color = "#e8ecf4"

    def __init__(
        self,
        *,
        source_conn_id: str = DEFAULT_CONN_ID,
        queue_name: str | None = None,
        replay_set: str | None = None,
        target_conn_id: str | None = None,
        target_queue_name: str | None = None,
        reasons: Sequence[str] | None = None,
        urns: Sequence[str] | None = None,
        exception_types: Sequence[str] | None = None,
        original_queues: Sequence[str] | None = None,
        min_age_seconds: float | None = None,
        max_age_seconds: float | None = None,
        max_attempts: int | None = None,
        max_messages: int | None = None,
        dry_run: bool = False,
        replay_bypass_header: bool = False,
        ledger_conn_id: str | None = None,
        ledger_name: str | None = None,
        max_messages_per_second: float | None = None,
        reserve_timeout: float = 0.0,
        batch_size: int = 500,
        progress_every: int = 1000,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        _check_source(queue_name, replay_set)
        _check_rate(max_messages_per_second)
        if reserve_timeout < 0 or batch_size < 1 or progress_every < 1:
            raise ValueError("reserve_timeout must not be negative; batch_size and progress_every must be positive")
        self.source_conn_id = source_conn_id
        self.queue_name = queue_name
        self.replay_set = replay_set
        self.target_conn_id = target_conn_id
        self.target_queue_name = target_queue_name
        self.reasons = reasons
        self.urns = urns
        self.exception_types = exception_types
        self.original_queues = original_queues
        self.min_age_seconds = min_age_seconds
        self.max_age_seconds = max_age_seconds
        self.max_attempts = max_attempts
        self.max_messages = max_messages
        # Not ``self.dry_run``: that name is BaseOperator's own method (Airflow calls it on every operator).
        self.replay_dry_run = dry_run
        self.replay_bypass_header = replay_bypass_header
        self.ledger_conn_id = ledger_conn_id
        self.ledger_name = ledger_name
        self.max_messages_per_second = max_messages_per_second
        self.reserve_timeout = reserve_timeout
        self.batch_size = batch_size
        self.progress_every = progress_every

    def _selection(self) -> Selection:
        selection = Selection(
            reasons=parse_names(self.reasons, "reasons"),
            urns=parse_names(self.urns, "urns"),
            exception_types=parse_names(self.exception_types, "exception_types"),
            original_queues=parse_names(self.original_queues, "original_queues"),
            min_age_seconds=parse_number(self.min_age_seconds, "min_age_seconds"),
            max_age_seconds=parse_number(self.max_age_seconds, "max_age_seconds"),
            max_attempts=parse_count(self.max_attempts, "max_attempts"),
        )
        low, high = selection.min_age_seconds, selection.max_age_seconds
        if low is not None and high is not None and low > high:
            raise ValueError(f"min_age_seconds ({low}) is greater than max_age_seconds ({high}): nothing could match")
        return selection

    def execute(self, context: Context) -> dict[str, Any]:
        # Rendered templates may leave "" (or "None") for the unused one of queue_name / replay_set.
        self.queue_name = None if is_unset(self.queue_name) else self.queue_name
        self.replay_set = None if is_unset(self.replay_set) else self.replay_set
        _check_source(self.queue_name, self.replay_set)
        self.max_messages_per_second = parse_number(self.max_messages_per_second, "max_messages_per_second")
        _check_rate(self.max_messages_per_second)
        selection = self._selection()
        dry_run = parse_flag(self.replay_dry_run, "dry_run")
        max_messages = parse_count(self.max_messages, "max_messages")
        target_queue = text_or_none(self.target_queue_name)
        target_conn = text_or_none(self.target_conn_id) or self.source_conn_id
        ledger_conn = text_or_none(self.ledger_conn_id) or target_conn
        with ExitStack() as stack:
            hooks: dict[str, Any] = {}

            def binding_of(conn_id: str) -> Binding:
                if conn_id not in hooks:
                    hooks[conn_id] = get_hook(conn_id)
                    stack.callback(hooks[conn_id].close)
                return hooks[conn_id].get_binding()

            target = binding_of(target_conn)
            dlq_queue: str | None = self.queue_name
            source = binding_of(self.source_conn_id) if dlq_queue is not None else None
            headers = None
            if self.replay_bypass_header:
                if target.carries_headers:
                    headers = {BYPASS_HEADER: 1}
                else:
                    self.log.info("replay_bypass_header is ignored: the %s binding of %r cannot carry headers",
                                  target.name, target_conn)
            replayer = Replayer(
                target=target, ledger_binding=binding_of(ledger_conn), ledger_name=text_or_none(self.ledger_name),
                target_queue_name=target_queue, source=source, selection=selection, max_messages=max_messages,
                dry_run=dry_run, headers=headers, max_messages_per_second=self.max_messages_per_second,
                batch_size=self.batch_size, progress_every=self.progress_every, log=self.log,
            )
            where = (f"the DLQ {source.dead_letter_name(dlq_queue)} of {self.source_conn_id!r}"
                     if source is not None and dlq_queue is not None else f"the replay set {self.replay_set}")
            self.log.info("%s %s to %s on %r (ledger on %r)", "dry run of a replay from" if dry_run else "replaying",
                          where, target_queue or "each message's original queue", target_conn, ledger_conn)
            try:
                if source is None or dlq_queue is None:
                    engine.feed_from_replay_set(replayer, str(self.replay_set), url_files=object_storage_files)
                elif dry_run and source.can_browse:
                    feed_from_browse(replayer, source, dlq_queue)
                else:
                    feed_from_dead_letters(replayer, source, dlq_queue, self.reserve_timeout)
                replayer.finish()
            except BaseException:
                replayer.abort()
                raise
        result = replayer.result.as_dict()
        if not dry_run:
            for target_name, replayed in result["targets"].items():
                metrics.count("replayed", replayed, conn_id=target_conn, queue_name=target_name)
            for reason, skipped in result["skipped"].items():
                metrics.count(f"replay_skipped.{metrics.metric_part(reason)}", skipped, conn_id=target_conn,
                              reason=reason)
            metrics.count("replay_skipped.duplicate", result["duplicates_avoided"], conn_id=target_conn)
        self.log.info("%s %d messages %s; skipped %s; duplicates avoided %d (%d kept in the DLQ)",
                      "would replay" if dry_run else "replayed", result["replayed"], result["targets"],
                      result["skipped"], result["duplicates_avoided"], result["duplicates_kept"])
        return result

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage's ``OperatorLineage`` of the run (the provider's listener calls this when the task ended): the
        dead-letter queues or replay set read and the queues republished to
        (:func:`~airflow_provider_babelqueue.lineage.replay_lineage`); ``None`` when OpenLineage is not installed."""
        from ..lineage import replay_lineage, run_result, to_operator_lineage

        return to_operator_lineage(replay_lineage(
            source_conn_id=self.source_conn_id, queue_name=None if is_unset(self.queue_name) else str(self.queue_name),
            replay_set=None if is_unset(self.replay_set) else str(self.replay_set),
            target_conn_id=text_or_none(self.target_conn_id) or self.source_conn_id, result=run_result(task_instance)))
