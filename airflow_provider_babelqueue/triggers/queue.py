"""Triggers: queue depth (for the deferrable depth sensor) and dead-letter arrival (an event trigger).

Both run the same pure checks as the sensors (:mod:`airflow_provider_babelqueue.checks`). Broker calls are
blocking, so each trigger owns one worker thread (:class:`.thread.BrokerThread`) that creates the hook and
binding once and reuses them for every poll; the event loop only awaits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from ..bindings.base import Binding
from ..engine.checks import dead_letter_status, depth_status, validate_depth_args
from ..engine.filters import message_filter
from ..hooks import DEFAULT_CONN_ID
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
    """Fires when dead letters arrive; usable by a deferred sensor and by ``AssetWatcher``.

    By default (``since_start=False``) it fires as soon as the DLQ holds ``min_count`` dead letters, including
    a backlog that was waiting when it started: a watcher started after a pause, a deploy or a triggerer restart
    starts a run for what is there, not only for what arrives next. After each event the baseline moves to the
    depth it reported, so the same dead letters do not fire twice while it runs; a restarted trigger may fire
    once more for dead letters still waiting, which a pipeline that drains and deduplicates by ``meta.id``
    absorbs. ``since_start=True`` takes the first observation as the baseline instead and counts only arrivals
    after it (an old backlog never fires). It keeps polling after an event, so one watcher reports every later
    arrival too.

    :param queue_name: the logical queue whose DLQ is watched.
    :param babelqueue_conn_id: the BabelQueue connection; the triggerer resolves it, never the DAG parser.
    :param min_count: how many (new) dead letters make an event.
    :param baseline: an explicit starting depth (the deferrable sensor passes the one it measured).
    :param since_start: without a baseline, take the first observation as the baseline (count only arrivals
        after the start); ``False`` (default) fires as soon as the DLQ holds ``min_count`` messages.
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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if min_count < 1:
            raise ValueError(f"min_count must be at least 1, got {min_count}")
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

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
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
            },
        )

    def _status(self, binding: Binding, baseline: int | None) -> Any:
        return dead_letter_status(
            binding,
            self.queue_name,
            min_count=self.min_count,
            baseline=baseline,
            reasons=self.reasons,
            urns=self.urns,
            jsonpath=self.jsonpath,
            sample_size=self.sample_size,
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        broker = BrokerThread(self.babelqueue_conn_id)
        baseline = self.baseline
        try:
            if baseline is None and self.since_start:
                baseline = await broker.call(lambda binding: binding.dead_letter_depth(self.queue_name))
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
        except Exception as exc:  # noqa: BLE001 - the task or the watcher log turns this into a clear failure
            yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
        finally:
            broker.close()
