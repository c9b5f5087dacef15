"""BabelQueueConsumeOperator: a bounded, conformant consumer run on any BabelQueue connection."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from ..core.errors import BabelQueueError
from ..engine.consume import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_NESTING_DEPTH,
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_MAX_RESULTS,
    DEFAULT_UNMATCHED_DELAY,
    Backoff,
    Consumer,
    UnknownUrnStrategy,
    check_handler,
    check_handler_key,
    check_limit,
)
from ..engine.filters import MessageFilter, message_filter
from ..engine.logs import DEFAULT_MESSAGE_LOG_LINES, check_message_log_lines
from ..hooks import DEFAULT_CONN_ID, get_hook
from ..observability import metrics
from ..observability.tracing import tracer_for
from ._params import is_template, is_unset, parse_count, parse_list, parse_number, text_or_none

__all__ = ["BabelQueueConsumeOperator", "ConsumeStoppedError", "DeadLettersProducedError", "resolve_handlers"]


class DeadLettersProducedError(BabelQueueError):
    """Raised after the run when ``fail_on_dead_letters`` is set and messages were dead-lettered."""


class ConsumeStoppedError(BabelQueueError):
    """Raised after a run that Airflow told to stop (``on_kill``: the task was marked failed or success, or its DAG
    run stopped), once the handled messages are settled and the ones not started handed back: the task did not do
    what it was asked, so it does not end as a success."""


def resolve_handlers(handlers: Mapping[str, Callable[..., Any] | str]) -> dict[str, Callable[..., Any]]:
    """URN → callable; a string value is a dotted path (``package.module.function``) imported at run time,
    which keeps DAG files free of handler imports."""
    from importlib import import_module

    resolved = {}
    for urn, target in handlers.items():
        if callable(target):
            resolved[urn] = target
            continue
        if not isinstance(target, str) or "." not in target:
            raise ValueError(f"handler for {urn!r} must be a callable or a dotted path, got {target!r}")
        module_name, _, attribute = target.rpartition(".")
        try:
            function = getattr(import_module(module_name), attribute)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"handler for {urn!r}: cannot import {target!r} ({exc})") from exc
        if not callable(function):
            raise ValueError(f"handler for {urn!r}: {target!r} is not callable")
        resolved[urn] = function
    return resolved


def _filter_of(urns: Any, jsonpath: Any) -> MessageFilter:
    """The rendered ``urns`` / ``jsonpath`` as a filter (unset values restrict nothing); ``ValueError`` names an
    invalid JSONPath."""
    return message_filter(parse_list(urns, "urns") or None, None if is_unset(jsonpath) else jsonpath)


def _unmatched_delay_of(value: Any) -> float:
    delay = parse_number(value, "unmatched_delay")
    return DEFAULT_UNMATCHED_DELAY if delay is None else delay


def _bounds_of(max_messages: Any, max_seconds: Any, stop_when_empty: bool) -> tuple[int | None, float | None]:
    """The run's rendered bounds; a run with none never finishes, so it is refused before it starts."""
    messages, seconds = parse_count(max_messages, "max_messages"), parse_number(max_seconds, "max_seconds")
    if messages is None and seconds is None and not stop_when_empty:
        raise ValueError("an unbounded consumer never finishes: set max_messages, max_seconds or stop_when_empty")
    return messages, seconds


def _batch_size_of(value: Any) -> int:
    size = parse_count(value, "batch_size") if isinstance(value, str) and not is_unset(value) else value
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1, got {value!r}")
    return size


class BabelQueueConsumeOperator(BaseOperator):
    """Consume a queue for a bounded run with the contract's consumer rules; returns a summary (XCom).

    Validation comes first: undecodable bodies (``poison``) and envelopes that fail validation are
    quarantined to the dead-letter queue with their reason, never dropped. Then the URN picks a handler;
    failures are retried with backoff and dead-lettered with reason ``failed`` once ``max_attempts``
    handler runs failed. The summary counts handled, retried, skipped duplicates and dead letters by reason, and
    its ``results`` list holds what the handlers returned (see ``max_results``).

    :param babelqueue_conn_id: the BabelQueue connection (templated); its type picks the broker.
    :param queue_name: the queue to consume (templated).
    :param handlers: URN → callable taking the envelope dict, or its dotted path as a string.
    :param max_messages: stop after this many deliveries (retries count as deliveries; messages a filter hands
        back do not; templated, so a run's params can size it).
    :param max_seconds: stop after this many seconds, so the task fits its schedule (templated).
    :param stop_when_empty: stop as soon as a reserve finds nothing within ``reserve_timeout`` (with a filter: nothing
        but messages this run handed back already).
    :param reserve_timeout: seconds each reserve waits for a message.
    :param max_attempts: handler runs before a failing message is dead-lettered (1 = no retry).
    :param backoff: ``exponential`` (default) or ``fixed`` delay before a retry is delivered again.
    :param backoff_base: the fixed delay, or the first exponential step, in seconds.
    :param backoff_cap: the longest exponential delay, in seconds.
    :param backoff_jitter: randomise exponential delays (50–100 %) so retries do not come back in bursts.
    :param unknown_urn_strategy: what to do when no handler is mapped: ``fail`` (retry, then dead-letter
        ``unknown_urn``), ``delete``, ``release`` or ``dead_letter`` (default).
    :param idempotency_conn_id: a SQL or Redis BabelQueue connection holding the seen-set of handled
        ``meta.id`` values (templated); ``None`` or blank disables idempotency. Redeliveries of handled
        messages are then acked without running the handler.
    :param idempotency_store: the seen-set's name (templated); defaults to ``consume:<queue_name>``.
    :param fail_on_dead_letters: fail the task after the run when anything was dead-lettered, so the DAG
        alerts; the summary is still pushed to XCom first.
    :param max_body_bytes: a longer body (default 16 MiB) is dead-lettered as ``poison``, bytes kept, with an
        error naming both sizes, before it is validated or handed to a handler: one runaway producer cannot
        exhaust the worker's memory. ``None`` turns the check off.
    :param max_nesting_depth: a body whose arrays/objects nest deeper (default 64; the envelope itself is level
        1) is dead-lettered as ``poison`` the same way, since deep nesting crashes recursive parsers and
        handlers. ``None`` turns the check off.
    :param max_outage_seconds: keep retrying the broker for up to this many seconds when it fails mid-run (a
        restart, a failover) before failing the task; every broker error is logged and counted in the summary's
        ``broker_errors``. 0 fails on the first one (then Airflow's task retries apply).
    :param batch_size: messages reserved at once (templated; RabbitMQ: the prefetch window is twice this; SQS takes
        at most 10 per receive). The handled messages of a batch are settled together, which is what lets a
        consumer keep up with the broker; a worker killed mid-batch has the batch's handled messages delivered
        again (an idempotency store makes that harmless). Batches shrink by themselves while handlers are slow.
    :param urns: only take messages whose URN matches one of these shell-style patterns (``urn:babel:orders:*``;
        templated; a list, one pattern, or a list's rendered text: JSON, Python's, or comma-separated), so several DAGs
        can share a queue. A message the filter does not take is handed back unhandled (bytes and ``attempts``
        unchanged), never acked or dead-lettered; poison and invalid envelopes match no filter. ``None``: every URN.
    :param jsonpath: only take messages whose ``data`` the RFC 9535 JSONPath selects something in (templated):
        ``$.coupon`` (present), ``$.items[?@.qty > 2]``, ``$[?$.amount > 100]`` (a top-level condition). Both
        set: both must match. An invalid expression fails when the DAG is parsed, with the reason.
    :param unmatched_delay: seconds a handed-back message stays hidden (templated; default 5), so the run moves
        past it instead of reserving it again, while the consumer it is meant for gets it within seconds.
    :param max_results: what handlers return (when not ``None``) goes to the summary's ``results`` as
        ``{"meta_id", "urn", "result"}``, in handling order, up to this many (default 100; 0 keeps none); the
        rest are counted in ``results_dropped``. A result that is not JSON-serialisable is counted in
        ``results_unserialisable`` and warned about once per URN and type.
    :param max_result_bytes: the JSON size the kept results may take together (default 64 KiB): the return value
        is stored in Airflow's metadata database and loaded whole by the UI and downstream tasks. A handler with a
        larger output should write it to storage and return a reference.
    :param message_log_lines: per-message lines of each kind (retry, dead letter, deletion) the task log gets in
        a minute (default 100); the rest are counted in one line a minute. A failing dependency fails every
        message, and a log of one line per message is slow to open; the returned summary counts them all.
        ``None`` logs every one.
    """

    template_fields: Sequence[str] = ("babelqueue_conn_id", "queue_name", "idempotency_conn_id",
                                      "idempotency_store", "urns", "jsonpath", "unmatched_delay", "max_messages",
                                      "max_seconds", "batch_size")
    ui_color = "#e8eef8"

    def __init__(
        self,
        *,
        queue_name: str,
        handlers: Mapping[str, Callable[..., Any] | str],
        babelqueue_conn_id: str = DEFAULT_CONN_ID,
        max_messages: int | str | None = None,
        max_seconds: float | str | None = None,
        stop_when_empty: bool = True,
        reserve_timeout: float = 1.0,
        max_attempts: int = 3,
        backoff: str = "exponential",
        backoff_base: float = 1.0,
        backoff_cap: float = 60.0,
        backoff_jitter: bool = True,
        unknown_urn_strategy: UnknownUrnStrategy | str = UnknownUrnStrategy.DEAD_LETTER,
        idempotency_conn_id: str | None = None,
        idempotency_store: str | None = None,
        fail_on_dead_letters: bool = False,
        max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES,
        max_nesting_depth: int | None = DEFAULT_MAX_NESTING_DEPTH,
        max_outage_seconds: float = 60.0,
        batch_size: int | str = DEFAULT_BATCH_SIZE,
        urns: str | Sequence[str] | None = None,
        jsonpath: str | None = None,
        unmatched_delay: float | str = DEFAULT_UNMATCHED_DELAY,
        max_results: int = DEFAULT_MAX_RESULTS,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        message_log_lines: int | None = DEFAULT_MESSAGE_LOG_LINES,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not is_template(max_messages) and not is_template(max_seconds):
            _bounds_of(max_messages, max_seconds, stop_when_empty)  # checked again once rendered, in execute
        self.babelqueue_conn_id = babelqueue_conn_id
        self.queue_name = queue_name
        for urn, target in handlers.items():  # what can be checked when the DAG is parsed (paths import later)
            if callable(target):
                check_handler(urn, target)
            else:
                check_handler_key(urn)
        self.handlers = dict(handlers)
        self.max_messages = max_messages
        self.max_seconds = max_seconds
        self.stop_when_empty = stop_when_empty
        self.reserve_timeout = reserve_timeout
        self.max_attempts = max_attempts
        self.backoff = Backoff(backoff, backoff_base, backoff_cap, backoff_jitter)  # validates early
        self.unknown_urn_strategy = UnknownUrnStrategy(unknown_urn_strategy)
        self.idempotency_conn_id = idempotency_conn_id
        self.idempotency_store = idempotency_store
        self.fail_on_dead_letters = fail_on_dead_letters
        self.max_body_bytes = check_limit(max_body_bytes, "max_body_bytes")
        self.max_nesting_depth = check_limit(max_nesting_depth, "max_nesting_depth")
        if not max_outage_seconds >= 0:
            raise ValueError(f"max_outage_seconds must be a number >= 0, got {max_outage_seconds!r}")
        self.max_outage_seconds = max_outage_seconds
        if not is_template(batch_size):
            _batch_size_of(batch_size)
        self.batch_size = batch_size
        self.urns = urns
        self.jsonpath = jsonpath
        self.unmatched_delay = unmatched_delay
        if not is_template(urns) and not is_template(jsonpath):
            _filter_of(urns, jsonpath)  # an invalid JSONPath fails when the DAG is parsed; built again in execute
        if not is_template(unmatched_delay):
            _unmatched_delay_of(unmatched_delay)
        for name, value in (("max_results", max_results), ("max_result_bytes", max_result_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
        self.max_results = max_results
        self.max_result_bytes = max_result_bytes
        self.message_log_lines = check_message_log_lines(message_log_lines)
        self._consumer: Consumer | None = None  # the run in progress, for on_kill

    def execute(self, context: Context) -> dict[str, Any]:
        handlers = resolve_handlers(self.handlers)
        rendered_filter = _filter_of(self.urns, self.jsonpath)
        unmatched_delay = _unmatched_delay_of(self.unmatched_delay)
        max_messages, max_seconds = _bounds_of(self.max_messages, self.max_seconds, self.stop_when_empty)
        batch_size = _batch_size_of(self.batch_size)
        hook = get_hook(self.babelqueue_conn_id)
        store_hook = None
        consumer: Consumer | None = None
        started = time.monotonic()
        try:
            store = None
            if is_unset(self.idempotency_conn_id):  # a template that rendered blank
                self.idempotency_conn_id = None
            if self.idempotency_conn_id is not None:
                store_hook = (
                    hook if self.idempotency_conn_id == self.babelqueue_conn_id else get_hook(self.idempotency_conn_id)
                )
                store = store_hook.get_binding().seen_store(
                    text_or_none(self.idempotency_store) or f"consume:{self.queue_name}"
                )
            binding = hook.get_binding()
            consumer = Consumer(
                binding,
                self.queue_name,
                handlers,
                max_attempts=self.max_attempts,
                backoff=self.backoff,
                unknown_urn=self.unknown_urn_strategy,
                idempotency=store,
                log=self.log,
                max_body_bytes=self.max_body_bytes,
                max_nesting_depth=self.max_nesting_depth,
                max_outage_seconds=self.max_outage_seconds,
                batch_size=batch_size,
                message_filter=rendered_filter,
                unmatched_delay=unmatched_delay,
                max_results=self.max_results,
                max_result_bytes=self.max_result_bytes,
                tracer=tracer_for(binding, conn_id=self.babelqueue_conn_id),
                message_log_lines=self.message_log_lines,
            )
            self._consumer = consumer
            run = consumer.run(
                max_messages=max_messages,
                max_seconds=max_seconds,
                stop_when_empty=self.stop_when_empty,
                reserve_timeout=self.reserve_timeout,
            )
        finally:
            self._consumer = None
            hook.close()
            if store_hook is not None and store_hook is not hook:
                store_hook.close()
            if consumer is not None:  # what the run did, also when it failed part way
                tags = {"conn_id": self.babelqueue_conn_id, "queue_name": self.queue_name}
                metrics.count_consumed(consumer.summary.as_dict(), **tags)
                metrics.timing("consume.duration", time.monotonic() - started, **tags)
        counts = run.as_dict()
        self.log.info("consumed %s: %s", self.queue_name, counts)
        summary = {**counts, "results": run.results}
        if consumer.stopped:
            raise ConsumeStoppedError(
                f"consuming {self.queue_name} stopped because the task was told to stop; {counts['handled']} "
                f"handled and settled, {counts['returned_unhandled']} handed back unhandled: {counts}")
        if self.fail_on_dead_letters and summary["dead_lettered"]:
            context["ti"].xcom_push(key="return_value", value=summary)
            raise DeadLettersProducedError(
                f"{sum(summary['dead_lettered'].values())} message(s) dead-lettered on "
                f"{self.queue_name}: {summary['dead_lettered']}"
            )
        return summary

    def on_kill(self) -> None:
        """Airflow stops the task (marked failed or success, its DAG run stopped): the consumer ends at the next
        message boundary, settles what it handled and hands back the rest of its batch,
        so those messages are ready again at once rather than after the broker's visibility timeout. Airflow waits
        a few seconds before it kills the process; a handler running longer than that is cut off with it, and its
        message comes back as after a crash. (An ``execution_timeout`` interrupts the run where it is instead: the
        batch comes back as after a crash.)"""
        consumer = self._consumer
        if consumer is not None:
            self.log.warning("stop requested: finishing the message in hand, then handing back the rest of %s",
                             self.queue_name)
            consumer.stop()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage's ``OperatorLineage`` of the run (the provider's listener calls this when the task ended, and
        when it failed): the queue read, and its dead-letter queue when the run dead-lettered
        (:func:`~airflow_provider_babelqueue.lineage.consume_lineage`); ``None`` when OpenLineage is not installed."""
        from ..lineage import consume_lineage, run_result, to_operator_lineage

        return to_operator_lineage(consume_lineage(self.babelqueue_conn_id, self.queue_name, run_result(task_instance)))
