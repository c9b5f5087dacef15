"""Sensors: queue depth and dead-letter arrival, for any BabelQueue connection.

Both run the pure checks of :mod:`airflow_provider_babelqueue.engine.checks` in ``poke``; with ``deferrable=True``
they check once and then hand the wait to a trigger that runs the very same check in the triggerer. The
dead-letter sensor can filter by reason, URN pattern and a JSONPath over ``data``, and can wait for a new kind of
failure instead of any arrival (``fire_on="new_fingerprint"``, :mod:`airflow_provider_babelqueue.engine.fingerprints`);
the depth sensor counts every message (a filter there would have to read the ready messages, which no broker does
without taking them). Every DLQ depth a sensor reads is sent as the gauge ``babelqueue.dlq_depth.<conn>.<queue>``.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue, conf

from ..bindings.base import BindingError
from ..engine.checks import dead_letter_status, depth_status, validate_depth_args
from ..engine.filters import MessageFilter, message_filter
from ..engine.fingerprints import (
    NewFingerprintStatus,
    default_store_name,
    fingerprint_groups,
    judge_new,
    known_fingerprints,
    remember_fingerprints,
    validate_fire_on,
)
from ..hooks import DEFAULT_CONN_ID, get_hook
from ..observability.metrics import gauge_dlq_depth
from ..operators._params import is_template, is_unset, parse_count, parse_list
from ..triggers.queue import BabelQueueDeadLetterTrigger, BabelQueueDepthTrigger

__all__ = ["BabelQueueDeadLetterSensor", "BabelQueueQueueDepthSensor"]


def _default_deferrable() -> bool:
    return conf.getboolean("operators", "default_deferrable", fallback=False)


def _filter_of(urns: Any, jsonpath: Any) -> MessageFilter:
    """The rendered ``urns`` / ``jsonpath`` as a filter: a list or its rendered or comma-separated text, and ``None``,
    ``""`` or ``"None"`` (an unset ``params`` entry) for "no restriction". ``ValueError`` names an invalid
    pattern or JSONPath."""
    return message_filter(parse_list(urns, "urns") or None, None if is_unset(jsonpath) else jsonpath)


class _BabelQueueSensor(BaseSensorOperator):
    """Keeps one hook for all pokes of a run (clients are reused) and closes it at the end."""

    def __init__(self, *, babelqueue_conn_id: str, deferrable: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.babelqueue_conn_id = babelqueue_conn_id
        self.deferrable = deferrable
        self._hook: Any = None

    @property
    def binding(self) -> Any:
        if self._hook is None:
            self._hook = get_hook(self.babelqueue_conn_id)
        return self._hook.get_binding()

    def _close(self) -> None:
        if self._hook is not None:
            self._hook.close()
            self._hook = None

    def _defer_timeout(self) -> datetime.timedelta | None:
        if self.timeout is None:
            return None
        return (
            self.timeout
            if isinstance(self.timeout, datetime.timedelta)
            else datetime.timedelta(seconds=float(self.timeout))
        )

    def _poll_interval(self) -> float:
        interval = self.poke_interval
        return interval.total_seconds() if isinstance(interval, datetime.timedelta) else float(interval)

    @staticmethod
    def _event_value(event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") != "success":
            raise BindingError(f"the trigger failed: {event.get('message', event)}")
        return event


class BabelQueueQueueDepthSensor(_BabelQueueSensor):
    """Waits until a queue's depth satisfies a comparison; the observed depth goes to XCom.

    The depth counts every message, whatever its URN or ``data``: a filter would have to read the ready messages,
    which no broker does without taking them. To react to matching messages use ``BabelQueueMessageTrigger``
    (``urns``, ``jsonpath``); to count matching dead letters, ``BabelQueueDeadLetterSensor``.

    :param babelqueue_conn_id: the BabelQueue connection (templated); its type picks the broker.
    :param queue_name: the queue to watch (templated).
    :param which: ``ready`` (messages waiting for a consumer) or ``dead_letter`` (its DLQ).
    :param comparison: one of ``>=``, ``>``, ``<=``, ``<``, ``==`` — e.g. ``<=`` with threshold 0 waits for a
        queue to drain, ``>=`` waits for a backlog.
    :param threshold: the depth to compare with (templated).
    :param consecutive: how many observations in a row must match, ``observation_interval`` seconds apart;
        raise it for brokers whose counts are eventually consistent (SQS) so one stale reading cannot end
        the wait.
    :param observation_interval: seconds between those observations.
    :param deferrable: free the worker slot while waiting (the triggerer polls instead); defaults to
        ``[operators] default_deferrable``.
    """

    template_fields: Sequence[str] = ("babelqueue_conn_id", "queue_name", "threshold")
    ui_color = "#f4efe0"

    def __init__(
        self,
        *,
        queue_name: str,
        babelqueue_conn_id: str = DEFAULT_CONN_ID,
        which: str = "ready",
        comparison: str = ">=",
        threshold: int = 1,
        consecutive: int = 1,
        observation_interval: float = 1.0,
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            babelqueue_conn_id=babelqueue_conn_id,
            deferrable=_default_deferrable() if deferrable is None else deferrable,
            **kwargs,
        )
        if isinstance(threshold, int):
            validate_depth_args(which, comparison, threshold, consecutive)
        self.queue_name = queue_name
        self.which = which
        self.comparison = comparison
        self.threshold = threshold
        self.consecutive = consecutive
        self.observation_interval = observation_interval

    def _threshold(self) -> int:
        """The rendered threshold; a template that renders as unset means the default, 1."""
        threshold = parse_count(self.threshold, "threshold")
        return 1 if threshold is None else threshold

    def _status(self) -> Any:
        return depth_status(
            self.binding,
            self.queue_name,
            which=self.which,
            comparison=self.comparison,
            threshold=self._threshold(),
            consecutive=self.consecutive,
            interval=self.observation_interval,
        )

    def poke(self, context: Context) -> PokeReturnValue:
        status = self._status()
        if self.which == "dead_letter":
            gauge_dlq_depth(self.babelqueue_conn_id, self.queue_name, status.depth)
        self.log.info(
            "%s depth of %s: %s (want %s %s)",
            self.which,
            self.queue_name,
            list(status.observations),
            self.comparison,
            self.threshold,
        )
        return PokeReturnValue(is_done=status.matched, xcom_value=status.depth)

    def execute(self, context: Context) -> Any:
        try:
            if not self.deferrable:
                return super().execute(context)
            status = self._status()
            if self.which == "dead_letter":
                gauge_dlq_depth(self.babelqueue_conn_id, self.queue_name, status.depth)
            if status.matched:
                return status.depth
        finally:
            self._close()
        self.defer(
            trigger=BabelQueueDepthTrigger(
                queue_name=self.queue_name,
                babelqueue_conn_id=self.babelqueue_conn_id,
                which=self.which,
                comparison=self.comparison,
                threshold=self._threshold(),
                consecutive=self.consecutive,
                observation_interval=self.observation_interval,
                poll_interval=self._poll_interval(),
            ),
            method_name="execute_complete",
            timeout=self._defer_timeout(),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> int:
        return int(self._event_value(event)["depth"])


class BabelQueueDeadLetterSensor(_BabelQueueSensor):
    """Waits until dead letters arrive; returns ``{"depth", "matching", "sample"}`` to XCom, the sample
    being up to ``sample_size`` ``{meta_id, urn, reason}`` entries (where the broker can browse its DLQ).

    With ``fire_on="new_fingerprint"`` it waits instead for a dead letter whose error fingerprint (the Spark
    triage's, :mod:`airflow_provider_babelqueue.core.fingerprint`) was never reported, and returns the payload of
    :meth:`~airflow_provider_babelqueue.engine.fingerprints.NewFingerprintStatus.as_dict` (the new fingerprints,
    each with a sample, and the counts). Reported fingerprints are remembered on the broker (a SQL table, a Redis
    set), so the next run, or a restarted trigger, waits for yet another one.

    :param babelqueue_conn_id: the BabelQueue connection (templated); its type picks the broker.
    :param queue_name: the queue whose dead-letter queue is watched (templated).
    :param min_count: how many dead letters (or new ones, see below) end the wait.
    :param new_only: count only dead letters that arrive after the sensor starts (its first observation is
        the baseline). Reschedule mode cannot keep that baseline between pokes: pass ``baseline`` there.
    :param baseline: an explicit starting depth (e.g. pulled from an earlier task); growth over it counts.
    :param reasons: only dead letters with one of these ``dead_letter.reason`` values count (templated).
    :param urns: only dead letters whose URN matches one of these shell-style patterns count (templated):
        ``urn:babel:orders:*`` watches a family of message types; an exact URN matches only itself
        (``fnmatch``, case-sensitive).
    :param jsonpath: only dead letters whose ``data`` (the original payload) this RFC 9535 query selects something
        in count (templated), so the wait ends for the failures that matter: ``$[?$.amount > 100]``. A poison
        body has no ``data`` and never matches. An invalid expression fails when the DAG is parsed (a templated
        one when the task runs). Filters need a broker that can browse its DLQ (SQL, Redis, Azure Service Bus).
    :param sample_size: how many entries the XCom sample holds.
    :param deferrable: free the worker slot while waiting; defaults to ``[operators] default_deferrable``.
    :param fire_on: ``arrival`` (default: dead letters arriving) or ``new_fingerprint`` (a dead letter with an
        error fingerprint never reported before; needs a broker that can browse its DLQ). With it, ``min_count``
        is how many dead letters a new fingerprint needs, ``new_only`` remembers the fingerprints already there
        at the first poke without ending the wait, and ``baseline`` is refused.
    :param fingerprint_conn_id: a ``babelqueue+sql`` or ``babelqueue+redis`` connection keeping the reported
        fingerprints (templated), for a broker that cannot keep them itself (Azure Service Bus); ``None``: the
        watched connection.
    :param fingerprint_store: the seen-set's name (templated); defaults to ``dlq-fingerprints:<queue_name>``.
        Sensors and triggers sharing a name share what counts as known.
    """

    template_fields: Sequence[str] = ("babelqueue_conn_id", "queue_name", "reasons", "urns", "jsonpath", "baseline",
                                      "fingerprint_conn_id", "fingerprint_store")
    ui_color = "#f8e8e8"

    def __init__(
        self,
        *,
        queue_name: str,
        babelqueue_conn_id: str = DEFAULT_CONN_ID,
        min_count: int = 1,
        new_only: bool = False,
        baseline: int | None = None,
        reasons: Sequence[str] | None = None,
        urns: str | Sequence[str] | None = None,
        jsonpath: str | None = None,
        sample_size: int = 5,
        deferrable: bool | None = None,
        fire_on: str = "arrival",
        fingerprint_conn_id: str | None = None,
        fingerprint_store: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            babelqueue_conn_id=babelqueue_conn_id,
            deferrable=_default_deferrable() if deferrable is None else deferrable,
            **kwargs,
        )
        if min_count < 1:
            raise ValueError(f"min_count must be at least 1, got {min_count}")
        validate_fire_on(fire_on)
        rescheduled = self.mode == "reschedule" and not self.deferrable
        if fire_on == "new_fingerprint":
            if baseline is not None:
                raise ValueError("baseline is a depth to grow from; fire_on='new_fingerprint' does not use it")
            if new_only and rescheduled:
                raise ValueError(
                    "new_only with fire_on='new_fingerprint' remembers the fingerprints found at the first poke, "
                    "and in reschedule mode every poke is a first one: use poke or deferrable mode"
                )
        elif new_only and baseline is None and rescheduled:
            raise ValueError(
                "new_only needs a baseline kept between pokes: use poke or deferrable mode, or pass "
                "baseline explicitly in reschedule mode"
            )
        self.fire_on = fire_on
        self.fingerprint_conn_id = fingerprint_conn_id
        self.fingerprint_store = fingerprint_store
        self._store_hook: Any = None
        self._learnt = False
        self.queue_name = queue_name
        self.min_count = min_count
        self.new_only = new_only
        self.baseline = baseline
        self.reasons = reasons
        self.urns = urns
        self.jsonpath = jsonpath
        if not is_template(urns) and not is_template(jsonpath):
            _filter_of(urns, jsonpath)  # an invalid pattern or JSONPath fails when the DAG is parsed
        self.sample_size = sample_size
        self._start_depth: int | None = None

    def _baseline(self) -> int | None:
        baseline = parse_count(self.baseline, "baseline")  # None too when a template rendered as unset
        if baseline is not None:
            return baseline
        if not self.new_only:
            return None
        if self.mode == "reschedule" and not self.deferrable:  # the template rendered as unset
            raise ValueError(
                f"baseline rendered to {self.baseline!r}; new_only in reschedule mode needs a baseline kept between "
                "pokes: give the param a value, or use poke or deferrable mode"
            )
        if self._start_depth is None:
            self._start_depth = self.binding.dead_letter_depth(self.queue_name)
            gauge_dlq_depth(self.babelqueue_conn_id, self.queue_name, self._start_depth)
            self.log.info("baseline for %s: %d dead letters already there", self.queue_name, self._start_depth)
        return self._start_depth

    def _filters(self) -> tuple[list[str] | None, MessageFilter]:
        """The rendered filters: the reasons (``None``: any) and the URN/JSONPath filter."""
        return parse_list(self.reasons, "reasons") or None, _filter_of(self.urns, self.jsonpath)

    def _status(self, baseline: int | None) -> Any:
        reasons, chosen = self._filters()
        status = dead_letter_status(
            self.binding,
            self.queue_name,
            min_count=self.min_count,
            baseline=baseline,
            reasons=reasons,
            urns=chosen.urns,
            jsonpath=chosen.jsonpath,
            sample_size=self.sample_size,
        )
        gauge_dlq_depth(self.babelqueue_conn_id, self.queue_name, status.depth)
        return status

    # ----------------------------------------------------------------------------- fire_on="new_fingerprint"

    def _store_conn_id(self) -> str | None:
        """The rendered fingerprint connection, ``None`` for the watched one."""
        conn_id = None if is_unset(self.fingerprint_conn_id) else self.fingerprint_conn_id
        return None if conn_id in (None, self.babelqueue_conn_id) else conn_id

    def _store_name(self) -> str:
        name = self.fingerprint_store
        return default_store_name(self.queue_name) if name is None or is_unset(name) else str(name)

    @property
    def store_binding(self) -> Any:
        """Where the reported fingerprints are kept: the watched connection, or ``fingerprint_conn_id``'s."""
        conn_id = self._store_conn_id()
        if conn_id is None:
            return self.binding
        if self._store_hook is None:
            self._store_hook = get_hook(conn_id)
        return self._store_hook.get_binding()

    def _close(self) -> None:
        super()._close()
        if self._store_hook is not None:
            self._store_hook.close()
            self._store_hook = None

    def _new_fingerprints(self) -> NewFingerprintStatus:
        """One new-fingerprint check; a match is remembered at once (the XCom carries it), and with ``new_only``
        the first check remembers what is there without a match."""
        reasons, chosen = self._filters()
        read = fingerprint_groups(self.binding, self.queue_name, reasons=reasons, urns=chosen.urns,
                                  jsonpath=chosen.jsonpath)
        gauge_dlq_depth(self.babelqueue_conn_id, self.queue_name, read.depth)
        name = self._store_name()
        known = known_fingerprints(self.store_binding, name, [group.fingerprint for group in read.groups])
        status = judge_new(read, known, min_count=self.min_count)
        if self.new_only and not self._learnt:
            self._learnt = True
            remember_fingerprints(self.store_binding, name, status.unreported)
            self.log.info("learnt %d fingerprints already in the DLQ of %s", len(status.unreported), self.queue_name)
            return judge_new(read, known | set(status.unreported), min_count=self.min_count)
        if status.matched:
            remember_fingerprints(self.store_binding, name, status.fingerprints)
            self.log.info("new error fingerprints in the DLQ of %s: %s", self.queue_name,
                          ", ".join(status.fingerprints[:10]))
        return status

    def _fingerprint_value(self, status: NewFingerprintStatus) -> dict[str, Any]:
        return {"fire_on": self.fire_on, **status.as_dict(self.sample_size)}

    def poke(self, context: Context) -> PokeReturnValue:
        if self.fire_on == "new_fingerprint":
            found = self._new_fingerprints()
            self.log.info("dead letters of %s: depth %d, %d new fingerprints", self.queue_name, found.read.depth,
                          len(found.new))
            return PokeReturnValue(is_done=found.matched, xcom_value=self._fingerprint_value(found))
        status = self._status(self._baseline())
        self.log.info("dead letters of %s: depth %d, matching %d", self.queue_name, status.depth, status.matching)
        return PokeReturnValue(is_done=status.matched, xcom_value=status.as_dict())

    def execute(self, context: Context) -> Any:
        reasons, chosen = self._filters()
        if chosen.active or reasons:
            self.log.info("dead letters of %s count when %s", self.queue_name, self._describe(reasons, chosen))
        new_fingerprint = self.fire_on == "new_fingerprint"
        baseline = None
        try:
            if not self.deferrable:
                return super().execute(context)
            if new_fingerprint:
                found = self._new_fingerprints()
                if found.matched:
                    return self._fingerprint_value(found)
            else:
                baseline = self._baseline()
                status = self._status(baseline)
                if status.matched:
                    return status.as_dict()
        finally:
            self._close()
        self.defer(
            trigger=BabelQueueDeadLetterTrigger(
                queue_name=self.queue_name,
                babelqueue_conn_id=self.babelqueue_conn_id,
                min_count=self.min_count,
                baseline=baseline,
                since_start=False,
                reasons=reasons,
                urns=list(chosen.urns) or None,
                jsonpath=chosen.jsonpath,
                sample_size=self.sample_size,
                poll_interval=self._poll_interval(),
                fire_on=self.fire_on,
                fingerprint_conn_id=self._store_conn_id() if new_fingerprint else None,
                fingerprint_store=self._store_name() if new_fingerprint else None,
            ),
            method_name="execute_complete",
            timeout=self._defer_timeout(),
        )

    @staticmethod
    def _describe(reasons: list[str] | None, chosen: MessageFilter) -> str:
        parts = [f"reason in {', '.join(reasons)}"] if reasons else []
        if chosen.active:
            parts.append(chosen.describe())
        return " and ".join(parts)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        value = self._event_value(event)
        if value.get("fire_on") == "new_fingerprint":
            # the trigger remembers them once its event is out; a trigger stopped right after its event (dag.test()
            # runs one inline and keeps the first event only) has not, so they are remembered here too (idempotent)
            try:
                remember_fingerprints(self.store_binding, self._store_name(),
                                      [entry["fingerprint"] for entry in value.get("new_fingerprints", ())])
            finally:
                self._close()
            return {key: item for key, item in value.items()
                    if key not in ("status", "queue_name", "babelqueue_conn_id")}
        return {"depth": value["depth"], "matching": value["matching"], "sample": value["sample"]}
