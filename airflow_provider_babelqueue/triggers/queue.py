"""Triggers: queue depth (for the deferrable depth sensor) and dead-letter arrival (an event trigger).

Both run the same pure checks as the sensors (:mod:`airflow_provider_babelqueue.engine.checks`, and
:mod:`airflow_provider_babelqueue.engine.fingerprints` for ``fire_on="new_fingerprint"``). Broker calls are
blocking, so each trigger owns one worker thread (:class:`.thread.BrokerThread`) that creates the hook and
binding once and reuses them for every poll; the event loop only awaits. Every DLQ depth read is sent as the gauge
``babelqueue.dlq_depth.<conn>.<queue>`` (:func:`~airflow_provider_babelqueue.observability.metrics.gauge_dlq_depth`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from ..bindings.base import Binding
from ..engine.checks import dead_letter_status, depth_status, validate_depth_args
from ..engine.filters import message_filter
from ..engine.fingerprints import (
    default_store_name,
    fingerprint_groups,
    judge_new,
    known_fingerprints,
    remember_fingerprints,
    validate_fire_on,
)
from ..hooks import DEFAULT_CONN_ID
from ..observability.metrics import gauge_dlq_depth
from .thread import BrokerThread

__all__ = ["BabelQueueDeadLetterTrigger", "BabelQueueDepthTrigger"]


class BabelQueueDepthTrigger(BaseTrigger):
    """Fires once when a queue's depth satisfies a comparison (see ``BabelQueueQueueDepthSensor``).

    The depth is the broker's count of every message, unfiltered: judging URNs or ``data`` would mean reading
    the ready messages, which no binding does without taking them. ``BabelQueueMessageTrigger`` reacts to the
    messages a filter matches.

    :param queue_name: the logical queue whose depth is watched.
    :param babelqueue_conn_id: the BabelQueue connection; the triggerer resolves it, never the DAG parser.
    :param which: ``ready`` (the queue) or ``dead_letter`` (its DLQ).
    :param comparison: ``>=``, ``>``, ``<=``, ``<`` or ``==`` against ``threshold``.
    :param threshold: the depth to compare with.
    :param consecutive: how many observations in a row must hold, so one noisy count does not fire it.
    :param observation_interval: seconds between those consecutive observations.
    :param poll_interval: seconds between checks; the binding's client is reused between them.
    """

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
        poll_interval: float = 30.0,
    ) -> None:
        super().__init__()
        validate_depth_args(which, comparison, threshold, consecutive)
        self.babelqueue_conn_id = babelqueue_conn_id
        self.queue_name = queue_name
        self.which = which
        self.comparison = comparison
        self.threshold = threshold
        self.consecutive = consecutive
        self.observation_interval = observation_interval
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "queue_name": self.queue_name,
                "babelqueue_conn_id": self.babelqueue_conn_id,
                "which": self.which,
                "comparison": self.comparison,
                "threshold": self.threshold,
                "consecutive": self.consecutive,
                "observation_interval": self.observation_interval,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        broker = BrokerThread(self.babelqueue_conn_id)
        try:
            while True:
                status = await broker.call(
                    _depth,
                    self.queue_name,
                    self.which,
                    self.comparison,
                    self.threshold,
                    self.consecutive,
                    self.observation_interval,
                )
                self.log.info("%s depth of %s: %s", self.which, self.queue_name, list(status.observations))
                if self.which == "dead_letter":
                    gauge_dlq_depth(self.babelqueue_conn_id, self.queue_name, status.depth)
                if status.matched:
                    yield TriggerEvent({"status": "success", "depth": status.depth, "queue_name": self.queue_name})
                    return
                await asyncio.sleep(self.poll_interval)
        except Exception as exc:  # noqa: BLE001 - the task turns this into a clear failure
            yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
        finally:
            broker.close()


def _depth(
    binding: Binding, queue_name: str, which: str, comparison: str, threshold: int, consecutive: int, interval: float
) -> Any:
    return depth_status(
        binding,
        queue_name,
        which=which,
        comparison=comparison,
        threshold=threshold,
        consecutive=consecutive,
        interval=interval,
    )


class BabelQueueDeadLetterTrigger(BaseEventTrigger):
    """Fires when dead letters arrive, or (``fire_on="new_fingerprint"``) when a dead letter with an error
    fingerprint never reported before arrives; usable by a deferred sensor and by ``AssetWatcher``.

    By default (``since_start=False``) it fires as soon as the DLQ holds ``min_count`` dead letters, including
    a backlog that was waiting when it started: a watcher started after a pause, a deploy or a triggerer restart
    starts a run for what is there, not only for what arrives next. After each event the baseline moves to the
    depth it reported, so the same dead letters do not fire twice while it runs; a restarted trigger may fire
    once more for dead letters still waiting, which a pipeline that drains and deduplicates by ``meta.id``
    absorbs. ``since_start=True`` takes the first observation as the baseline instead and counts only arrivals
    after it (an old backlog never fires). It keeps polling after an event, so one watcher reports every later
    arrival too.

    With ``fire_on="new_fingerprint"`` each poll reads the first 1000 dead letters without removing them
    (:mod:`~airflow_provider_babelqueue.engine.fingerprints`), groups them by the triage's error fingerprint
    (:mod:`~airflow_provider_babelqueue.core.fingerprint`) and fires for the fingerprints the seen-set
    ``fingerprint_store`` does not hold yet; they are added to it once the event is out. The set lives on the
    broker (a SQL table, a Redis set), so a restarted trigger (a new instance with the same serialized kwargs)
    does not fire again for them: at least once per fingerprint, never once per poll. It needs a broker that can
    browse its DLQ (SQL, Redis, Azure Service Bus) and a store (the connection itself on SQL and Redis, else
    ``fingerprint_conn_id``).

    :param queue_name: the logical queue whose DLQ is watched.
    :param babelqueue_conn_id: the BabelQueue connection; the triggerer resolves it, never the DAG parser.
    :param min_count: how many (new) dead letters make an event; with ``fire_on="new_fingerprint"``, how many
        dead letters a new fingerprint needs before it is reported (a rarer one waits, unremembered).
    :param baseline: an explicit starting depth (the deferrable sensor passes the one it measured); arrival mode
        only.
    :param since_start: without a baseline, take the first observation as the baseline (count only arrivals
        after the start); ``False`` (default) fires as soon as the DLQ holds ``min_count`` messages. With
        ``fire_on="new_fingerprint"``: the fingerprints in the DLQ at the first observation are remembered
        without an event, so only error kinds that appear afterwards fire.
    :param reasons: only dead letters with one of these ``dead_letter.reason`` values count (needs a broker
        that can browse its DLQ).
    :param urns: only dead letters whose URN matches one of these shell-style patterns count (``fnmatch``,
        case-sensitive; an exact URN matches only itself), so one watcher covers a family of message types
        (same condition).
    :param jsonpath: only dead letters whose ``data`` (the original payload) this RFC 9535 query selects something
        in count, so a watcher fires for the failures that matter, e.g. ``$[?$.amount > 100]`` (same
        condition). A poison body has no ``data`` and never matches. Checked when the trigger is built: an
        invalid expression fails where the DAG is parsed, not in the triggerer.
    :param sample_size: how many ``{meta_id, urn, reason}`` entries the event carries.
    :param poll_interval: seconds between checks; the binding's client is reused between them.
    :param fire_on: ``arrival`` (default: dead letters arriving) or ``new_fingerprint`` (a dead letter whose
        error fingerprint was never reported), so an alert fires once per new kind of failure, not per message.
    :param fingerprint_conn_id: a ``babelqueue+sql`` or ``babelqueue+redis`` connection keeping the reported
        fingerprints, for a broker that cannot keep them itself (Azure Service Bus); ``None``: the watched
        connection.
    :param fingerprint_store: the name of the seen-set of reported fingerprints; defaults to
        ``dlq-fingerprints:<queue_name>``. Watchers sharing a name share what counts as known.
    """

    def __init__(
        self,
        *,
        queue_name: str,
        babelqueue_conn_id: str = DEFAULT_CONN_ID,
        min_count: int = 1,
        baseline: int | None = None,
        since_start: bool = False,
        reasons: Sequence[str] | None = None,
        urns: str | Sequence[str] | None = None,
        jsonpath: str | None = None,
        sample_size: int = 5,
        poll_interval: float = 30.0,
        fire_on: str = "arrival",
        fingerprint_conn_id: str | None = None,
        fingerprint_store: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if min_count < 1:
            raise ValueError(f"min_count must be at least 1, got {min_count}")
        validate_fire_on(fire_on)
        if fire_on == "new_fingerprint" and baseline is not None:
            raise ValueError("baseline is a depth to grow from; fire_on='new_fingerprint' does not use it")
        chosen = message_filter(urns, jsonpath)  # an invalid pattern or JSONPath fails where the DAG is parsed
        self.babelqueue_conn_id = babelqueue_conn_id
        self.queue_name = queue_name
        self.min_count = min_count
        self.baseline = baseline
        self.since_start = since_start
        self.reasons = list(reasons) if reasons else None
        self.urns = list(chosen.urns) or None
        self.jsonpath = chosen.jsonpath
        self.sample_size = sample_size
        self.poll_interval = poll_interval
        self.fire_on = fire_on
        self.fingerprint_conn_id = fingerprint_conn_id or None
        self.fingerprint_store = fingerprint_store or None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "queue_name": self.queue_name,
            "babelqueue_conn_id": self.babelqueue_conn_id,
            "min_count": self.min_count,
            "baseline": self.baseline,
            "since_start": self.since_start,
            "reasons": self.reasons,
            "urns": self.urns,
            "jsonpath": self.jsonpath,
            "sample_size": self.sample_size,
            "poll_interval": self.poll_interval,
        }
        # only when set: an arrival trigger serializes as before, so an AssetWatcher's trigger keeps its identity
        for name in ("fire_on", "fingerprint_conn_id", "fingerprint_store"):
            if getattr(self, name) not in (None, "arrival"):
                kwargs[name] = getattr(self, name)
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    def _status(self, binding: Binding, baseline: int | None) -> Any:
        status = dead_letter_status(
            binding,
            self.queue_name,
            min_count=self.min_count,
            baseline=baseline,
            reasons=self.reasons,
            urns=self.urns,
            jsonpath=self.jsonpath,
            sample_size=self.sample_size,
        )
        gauge_dlq_depth(self.babelqueue_conn_id, self.queue_name, status.depth)
        return status

    def _depth(self, binding: Binding) -> int:
        depth = binding.dead_letter_depth(self.queue_name)
        gauge_dlq_depth(self.babelqueue_conn_id, self.queue_name, depth)
        return depth

    async def run(self) -> AsyncIterator[TriggerEvent]:
        broker = BrokerThread(self.babelqueue_conn_id)
        try:
            if self.fire_on == "new_fingerprint":
                async for event in self._new_fingerprints(broker):
                    yield event
            else:
                async for event in self._arrivals(broker):
                    yield event
        except Exception as exc:  # noqa: BLE001 - the task or the watcher log turns this into a clear failure
            yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
        finally:
            broker.close()

    async def _arrivals(self, broker: BrokerThread) -> AsyncIterator[TriggerEvent]:
        baseline = self.baseline
        if baseline is None and self.since_start:
            baseline = await broker.call(self._depth)
            self.log.info("watching dead letters of %s from depth %d", self.queue_name, baseline)
        while True:
            status = await broker.call(self._status, baseline)
            if status.matched:
                new = status.depth - baseline if baseline is not None else status.depth
                payload = {
                    "status": "success",
                    "queue_name": self.queue_name,
                    "babelqueue_conn_id": self.babelqueue_conn_id,
                    "new": new,
                    **status.as_dict(),
                }
                self.log.info("dead letters arrived on %s: %s", self.queue_name, payload)
                yield TriggerEvent(payload)
                baseline = status.depth
            elif baseline is not None and status.depth < baseline:
                baseline = status.depth  # drained meanwhile: count arrivals from the new level
            await asyncio.sleep(self.poll_interval)

    def _groups(self, binding: Binding) -> Any:
        read = fingerprint_groups(binding, self.queue_name, reasons=self.reasons, urns=self.urns,
                                  jsonpath=self.jsonpath)
        gauge_dlq_depth(self.babelqueue_conn_id, self.queue_name, read.depth)
        return read

    async def _new_fingerprints(self, broker: BrokerThread) -> AsyncIterator[TriggerEvent]:
        name = self.fingerprint_store or default_store_name(self.queue_name)
        separate = self.fingerprint_conn_id not in (None, self.babelqueue_conn_id)
        store = BrokerThread(self.fingerprint_conn_id) if separate and self.fingerprint_conn_id else broker
        try:
            learn = self.since_start
            while True:
                read = await broker.call(self._groups)
                known = await store.call(known_fingerprints, name, [group.fingerprint for group in read.groups])
                status = judge_new(read, known, min_count=self.min_count)
                if learn:
                    await store.call(remember_fingerprints, name, status.unreported)
                    self.log.info("learnt %d fingerprints already in the DLQ of %s", len(status.unreported),
                                  self.queue_name)
                    learn = False
                elif status.matched:
                    payload = {
                        "status": "success",
                        "queue_name": self.queue_name,
                        "babelqueue_conn_id": self.babelqueue_conn_id,
                        "fire_on": self.fire_on,
                        **status.as_dict(self.sample_size),
                    }
                    self.log.info("new error fingerprints in the DLQ of %s: %s", self.queue_name,
                                  ", ".join(status.fingerprints[:10]))
                    yield TriggerEvent(payload)
                    # remembered once the event is out: a crash in between reports them again (at least once)
                    await store.call(remember_fingerprints, name, status.fingerprints)
                await asyncio.sleep(self.poll_interval)
        finally:
            if store is not broker:
                store.close()
