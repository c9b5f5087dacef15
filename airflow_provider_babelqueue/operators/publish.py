"""BabelQueuePublishOperator: publish envelopes to any BabelQueue connection."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from ..core import envelope as bq
from ..hooks import DEFAULT_CONN_ID, get_hook

__all__ = ["BabelQueuePublishOperator"]


class BabelQueuePublishOperator(BaseOperator):
    """Build and publish BabelQueue envelopes; returns the published ``meta.id`` values (XCom).

    Give either ``urn`` + ``data`` (one dict publishes one message; a list of dicts publishes a batch with
    the broker's native batching), or ready ``envelopes`` (dicts or encoded bytes/str, e.g. pulled from
    XCom), which are checked and published unchanged.

    :param babelqueue_conn_id: the BabelQueue connection (SQL, Redis, RabbitMQ, ...; templated); its type picks
        the broker, so the same DAG works on any of them.
    :param queue_name: the logical queue (``meta.queue``) and where the messages go (templated).
    :param urn: the message identity consumers route on (templated).
    :param data: the payload dict, or a list of payload dicts for a batch (templated).
    :param envelopes: ready envelopes to publish as they are; mutually exclusive with ``urn``/``data``.
    :param trace_id: continue an existing trace (templated); by default every message starts a new one.
    :param delay: seconds before the messages become visible (single messages; a batch is sent at once).
    :param headers: broker headers for brokers that carry them (e.g. ``{"bq-replay-bypass": 1}``).
    """

    template_fields: Sequence[str] = ("babelqueue_conn_id", "urn", "data", "queue_name", "trace_id", "envelopes")
    template_fields_renderers = {"data": "json", "envelopes": "json"}
    ui_color = "#e8f4ea"

    def __init__(
        self,
        *,
        queue_name: str,
        babelqueue_conn_id: str = DEFAULT_CONN_ID,
        urn: str | None = None,
        data: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        envelopes: Sequence[Mapping[str, Any] | bytes | str] | None = None,
        trace_id: str | None = None,
        delay: float = 0,
        headers: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (envelopes is None) == (urn is None):
            raise ValueError("give either urn (with data) or envelopes, not both and not neither")
        if delay < 0:
            raise ValueError(f"delay must not be negative, got {delay}")
        self.babelqueue_conn_id = babelqueue_conn_id
        self.queue_name = queue_name
        self.urn = urn
        self.data = {} if data is None and urn is not None else data
        self.envelopes = envelopes
        self.trace_id = trace_id
        self.delay = delay
        self.headers = dict(headers or {})

    def _bodies(self) -> list[bytes]:
        if self.envelopes is not None:
            bodies = []
            for index, item in enumerate(self.envelopes):
                env = item if isinstance(item, Mapping) else bq.decode(item)
                reason = bq.check(env)
                if reason is not None:
                    raise ValueError(f"envelopes[{index}] is not publishable: {reason}")
                bodies.append(
                    item if isinstance(item, bytes) else bq.encode(env) if isinstance(item, Mapping) else item.encode()
                )
            return bodies
        payloads = [self.data] if isinstance(self.data, Mapping) else list(self.data or [])
        urn = self.urn
        assert urn is not None  # __init__ requires urn when envelopes is not given
        return [
            bq.encode(bq.make_envelope(urn, payload, queue_name=self.queue_name, trace_id=self.trace_id))
            for payload in payloads
        ]

    def execute(self, context: Context) -> list[str]:
        bodies = self._bodies()
        ids = [bq.meta_id_of(bq.decode(body)) for body in bodies]
        hook = get_hook(self.babelqueue_conn_id)
        try:
            binding = hook.get_binding()
            if len(bodies) == 1:
                binding.publish(bodies[0], self.queue_name, headers=self.headers or None, delay=self.delay)
            elif bodies:
                if self.delay:
                    self.log.warning("delay applies to single messages; the batch of %d is sent now", len(bodies))
                binding.publish_batch(bodies, self.queue_name)
        finally:
            hook.close()
        self.log.info("published %d message(s) to %s via %s", len(bodies), self.queue_name, self.babelqueue_conn_id)
        return ids
