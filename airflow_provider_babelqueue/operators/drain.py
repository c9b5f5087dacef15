"""BabelQueueDrainDeadLettersOperator: copy or move dead letters from any broker into a JSON Lines file."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseOperator, Context

from ..bindings.base import NotSupportedError
from ..engine.drain import DrainSource, LocalFileSink, Sink, StreamSink, drain_dead_letters, file_name
from ..hooks import DEFAULT_CONN_ID, get_hook
from ..observability import metrics
from ._params import is_unset, parse_count, parse_rendered

__all__ = ["BabelQueueDrainDeadLettersOperator"]

_FILE_SUFFIXES = (".jsonl", ".ndjson", ".json")
_LOCAL_SCHEMES = ("", "file", "local")


def _normalise_sources(sources: Any) -> list[tuple[str, str]]:
    if isinstance(sources, str):  # a template rendered to text
        sources = parse_rendered(sources.strip(), "sources", "a list of dicts")
    if isinstance(sources, Mapping):
        sources = [sources]
    if not isinstance(sources, Sequence) or isinstance(sources, str | bytes) or not sources:
        raise ValueError("sources must be a non-empty list of {'babelqueue_conn_id': ..., 'queue_name': ...}")
    out = []
    for index, item in enumerate(sources):
        if not isinstance(item, Mapping) or not item.get("queue_name"):
            raise ValueError(f"sources[{index}] must be a dict with a 'queue_name' (and a 'babelqueue_conn_id')")
        unknown = set(item) - {"babelqueue_conn_id", "queue_name"}
        if unknown:
            raise ValueError(f"sources[{index}] has unknown keys {sorted(unknown)}")
        out.append((str(item.get("babelqueue_conn_id") or DEFAULT_CONN_ID), str(item["queue_name"])))
    return out


def open_destination(destination: Any, run_id: str | None) -> Sink:
    """The sink for a local path, a ``file://`` URL or any ``ObjectStoragePath`` URL.

    A destination ending in ``.jsonl``/``.ndjson``/``.json`` is the file itself (it must not exist);
    anything else is a folder that receives a new ``dlq-<run id>-<uuid>.jsonl``. Local files get the
    fsync-per-batch sink; other schemes stream to the object store.
    """
    text = destination if isinstance(destination, str) else str(destination)
    text = text.strip()
    if is_unset(text):
        raise ValueError(f"destination must be a local path or an object storage URL, got {destination!r}")
    is_file = text.lower().endswith(_FILE_SUFFIXES)
    parts = urlsplit(text)
    scheme = parts.scheme.lower() if len(parts.scheme) > 1 else ""  # "C:" is a drive, not a scheme
    name = file_name(run_id, uuid.uuid4().hex[:12])
    if scheme in _LOCAL_SCHEMES:
        local = os.path.expanduser(parts.path if scheme else text)
        if not os.path.isabs(local):
            # a moved dead letter is out of the broker: its file must be where someone will look for it
            raise ValueError(
                f"destination {text!r} is a relative path; give an absolute path (or an object storage URL): a "
                f"relative one would land in whatever working directory the task process has ({os.getcwd()} "
                "here), which differs between workers and deployments"
            )
        return LocalFileSink(local if is_file else os.path.join(local, name))
    from airflow.sdk import ObjectStoragePath

    base = destination if isinstance(destination, ObjectStoragePath) else ObjectStoragePath(text)
    target = base if is_file else base / name
    if target.exists():
        raise FileExistsError(f"drain destination {target} exists already; a drain never overwrites an object")
    if not is_file:
        base.mkdir(parents=True, exist_ok=True)
    return StreamSink(lambda: target.open("wb"), str(target))


class BabelQueueDrainDeadLettersOperator(BaseOperator):
    """Copy or move dead letters from one or more queues, on any broker, into one new JSON Lines file.

    Each line is a drain record (``docs/drain-records.md``) holding the dead letter's body exactly as the
    broker stored it, so triage (the Spark jobs) sees the evidence unaltered. In ``move`` mode a message
    leaves its DLQ only after the file holding it is durable: at-least-once, never at-most-once. A crash
    between the write and the ack leaves a message in both places; readers drop such duplicates by
    ``meta.id``. Returns ``{"path", "records", "bytes", "by_source"}`` (XCom).

    :param sources: the queues to drain, as a list of ``{"babelqueue_conn_id": ..., "queue_name": ...}``
        (templated), so one task and one file can cover several brokers. Mutually exclusive with
        ``queue_name``.
    :param babelqueue_conn_id: shorthand for one source: its connection (any BabelQueue type; templated); the
        type picks the broker, so the operator never needs to know which one it is.
    :param queue_name: shorthand for one source: the logical queue whose DLQ is drained (templated). The DLQ's
        broker-side name (``orders:failed``, ``jobs_failed``, ...) comes from the binding.
    :param destination: a local folder or file, or any ``ObjectStoragePath`` URL (``file://``, ``s3://``,
        ``gs://``...; templated). A folder receives a new ``dlq-<run id>-<uuid>.jsonl`` per run; a path
        ending in ``.jsonl`` is used as the file name and must not exist: a drain never overwrites data.
    :param mode: ``move`` (default) reserves each dead letter, writes it, makes the file durable, then acks;
        ``browse`` copies without removing anything (for a look before a replay), on brokers that can read
        their DLQ non-destructively; others fail up front with an error naming the broker.
    :param max_messages: stop after this many records over all sources, to bound a run's time and file size
        (templated; ``None`` = everything).
    :param max_bytes: stop before a record would take the file past this many bytes (templated); the first
        record is always written so one oversized message cannot block every future drain. A message
        reserved but left out is released back to its DLQ unchanged.
    :param reserve_timeout: seconds to wait for the next dead letter before a source counts as empty
        (``move`` mode); 0 drains what is there now and returns.
    :param batch_records: records per durable batch: the file is synced and the batch acked every this many
        records (or 8 MiB). Larger batches are faster; a crash re-delivers at most one batch as duplicates, or
        two on Redis, whose drain acks a batch while the next one is being synced (it also holds the next
        batch reserved ahead: after a crash, reserved messages return when the visibility timeout expires).
    :param progress_every: log a progress line every this many records.
    """

    template_fields: Sequence[str] = (
        "sources", "babelqueue_conn_id", "queue_name", "destination", "max_messages", "max_bytes",
    )
    template_fields_renderers = {"sources": "json"}
    ui_color = "#f4e8e8"

    def __init__(
        self,
        *,
        destination: str,
        sources: Sequence[Mapping[str, str]] | str | None = None,
        babelqueue_conn_id: str = DEFAULT_CONN_ID,
        queue_name: str | None = None,
        mode: str = "move",
        max_messages: int | None = None,
        max_bytes: int | None = None,
        reserve_timeout: float = 0.0,
        batch_records: int = 1000,
        progress_every: int = 10_000,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (sources is None) == (queue_name is None):
            raise ValueError("give either sources or queue_name (with babelqueue_conn_id), not both and not neither")
        if mode not in ("move", "browse"):
            raise ValueError(f"mode must be 'move' or 'browse', got {mode!r}")
        if reserve_timeout < 0 or batch_records < 1 or progress_every < 1:
            raise ValueError("reserve_timeout must not be negative; batch_records and progress_every must be positive")
        self.sources = sources
        self.babelqueue_conn_id = babelqueue_conn_id
        self.queue_name = queue_name
        self.destination = destination
        self.mode = mode
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.reserve_timeout = reserve_timeout
        self.batch_records = batch_records
        self.progress_every = progress_every

    def _pairs(self) -> list[tuple[str, str]]:
        """The ``(conn id, queue)`` sources this run drains."""
        if self.sources is not None:
            return _normalise_sources(self.sources)
        return [(self.babelqueue_conn_id, str(self.queue_name))]

    def execute(self, context: Context) -> dict[str, Any]:
        pairs = self._pairs()
        max_messages = parse_count(self.max_messages, "max_messages")
        max_bytes = parse_count(self.max_bytes, "max_bytes")
        with ExitStack() as stack:
            hooks: dict[str, Any] = {}
            sources = []
            for conn_id, queue_name in pairs:
                if conn_id not in hooks:
                    hooks[conn_id] = get_hook(conn_id)
                    stack.callback(hooks[conn_id].close)
                binding = hooks[conn_id].get_binding()
                if self.mode == "browse" and not binding.can_browse:
                    raise NotSupportedError(
                        f"mode='browse' needs a broker that can read its dead-letter queue without removing "
                        f"messages; the {binding.name} binding of connection {conn_id!r} cannot "
                        f"({binding.dead_letter_name(queue_name)}). Use mode='move' to drain it."
                    )
                sources.append(DrainSource(binding, queue_name, conn_id))
            run_id = context.get("run_id") if isinstance(context, Mapping) else None
            sink = open_destination(self.destination, run_id)
            self.log.info("%s dead letters of %s into %s", "moving" if self.mode == "move" else "copying",
                          ", ".join(source.key for source in sources), sink.location)
            result = drain_dead_letters(
                sources, sink, mode=self.mode, max_messages=max_messages, max_bytes=max_bytes,
                reserve_timeout=self.reserve_timeout, batch_records=self.batch_records,
                progress_every=self.progress_every, log=self.log,
            )
        self.log.info("drain done: %d records, %d bytes in %s; per source: %s", result.records, result.bytes,
                      result.path, result.by_source)
        for (conn_id, queue_name), source in zip(pairs, sources, strict=True):
            metrics.count("drained", result.by_source.get(source.key, 0), conn_id=conn_id, queue_name=queue_name)
        return result.as_dict()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage's ``OperatorLineage`` of the run (the provider's listener calls this when the task ended): the
        dead-letter queues read and the drain file written
        (:func:`~airflow_provider_babelqueue.lineage.drain_lineage`); ``None`` when OpenLineage is not installed."""
        from ..lineage import drain_lineage, run_result, to_operator_lineage

        return to_operator_lineage(drain_lineage(self._pairs(), run_result(task_instance)))
