"""BabelQueuePublishOperator: publish envelopes to any BabelQueue connection."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from ..bindings.base import Binding
from ..core import envelope as bq
from ..core.errors import EnvelopeDecodeError
from ..hooks import DEFAULT_CONN_ID, get_hook
from ..observability import metrics
from ..observability.tracing import tracer_for
from ._params import is_unset, parse_rendered

__all__ = ["BabelQueuePublishOperator", "payloads_of", "ready_envelopes_of"]


def _meta_ids(bodies: list[bytes]) -> list[str]:
    return [bq.meta_id_of(bq.decode(body)) for body in bodies]


def payloads_of(data: Any) -> list[Mapping[str, Any]]:
    """The payloads ``data`` publishes, one per message, from what its template rendered.

    :param data: a dict (one message), a list of dicts (a batch), their rendered text (JSON, or Python's text
        of the value: see :func:`~._params.parse_rendered`), or ``None`` (one message with an empty payload, as
        when ``data`` is not given).
    :raises ValueError: naming the item that is not a dict, or saying how to fix text that cannot be read. Text
        that renders as unset (blank, ``"None"``) is refused rather than read as an empty payload: it is
        what an unset param or a missing ``dag_run.conf`` key renders, and publishing an empty order in its
        place would be a silent error.
    """
    if isinstance(data, str):
        if is_unset(data):
            raise _rendered_unset("data", data, "give the payload, or {} for an empty one")
        data = parse_rendered(data.strip(), "data", _PAYLOADS)
    if data is None or isinstance(data, Mapping):
        return [data or {}]
    if not isinstance(data, Sequence) or isinstance(data, bytes | bytearray):
        raise ValueError(f"data must be {_PAYLOADS}, got {type(data).__name__}")
    for index, payload in enumerate(data):
        if not isinstance(payload, Mapping):
            raise ValueError(f"data[{index}] must be a dict (one message's payload), got {type(payload).__name__}")
    return list(data)


def ready_envelopes_of(envelopes: Any) -> list[Mapping[str, Any] | bytes | str]:
    """The ready envelopes ``envelopes`` publishes, from what its template rendered.

    :param envelopes: a list of envelope dicts or encoded envelopes (bytes or str), one envelope alone, or the
        rendered text of either (as for ``data``); the text of one encoded envelope is kept as it is, so it is
        forwarded byte for byte.
    :raises ValueError: for a value that holds no envelopes, or text that cannot be read.
    """
    if isinstance(envelopes, bytes | bytearray | str):
        text = envelopes.decode("utf-8", "replace") if isinstance(envelopes, bytes | bytearray) else envelopes
        if is_unset(text):
            raise _rendered_unset("envelopes", text, "give the envelopes, or [] to publish nothing")
        value = parse_rendered(text.strip(), "envelopes", _ENVELOPES)
        if isinstance(value, dict):
            return [bytes(envelopes) if isinstance(envelopes, bytes | bytearray) else envelopes]
        if isinstance(value, bytes | str):  # the text of one encoded envelope, quoted
            return [value]
        envelopes = value
    if isinstance(envelopes, Mapping):
        return [envelopes]
    if not isinstance(envelopes, Sequence):
        raise ValueError(f"envelopes must be {_ENVELOPES}, got {type(envelopes).__name__}")
    for index, item in enumerate(envelopes):
        if not isinstance(item, Mapping | bytes | str):
            raise ValueError(
                f"envelopes[{index}] must be an envelope dict or its encoded bytes/str, got {type(item).__name__}"
            )
    return list(envelopes)


def _rendered_unset(name: str, text: str, fix: str) -> ValueError:
    return ValueError(
        f"{name} rendered to {text!r}, which is what an unset param, a missing dag_run.conf key or an empty XCom "
        f"renders; {fix}"
    )


_PAYLOADS = "a dict (one message) or a list of dicts (a batch)"
_ENVELOPES = "a list of envelopes (dicts, or encoded bytes/str)"


class BabelQueuePublishOperator(BaseOperator):
    """Build and publish BabelQueue envelopes; returns the published ``meta.id`` values (XCom).

    Give either ``urn`` + ``data`` (one dict publishes one message; a list of dicts publishes a batch with
    the broker's native batching), or ready ``envelopes`` (dicts or encoded bytes/str, e.g. pulled from
    XCom), which are checked and published unchanged.

    :param babelqueue_conn_id: the BabelQueue connection (SQL, Redis, RabbitMQ, ...; templated); its type picks
        the broker, so the same DAG works on any of them.
    :param queue_name: the logical queue (``meta.queue``) and where the messages go (templated).
    :param urn: the message identity consumers route on (templated).
    :param data: the payload dict, or a list of payload dicts for a batch (templated); a template renders
        text, so rendered text is read back as JSON or as Python's text of the value.
    :param envelopes: ready envelopes to publish as they are (templated, rendered text as for ``data``); mutually
        exclusive with ``urn``/``data``.
    :param trace_id: continue an existing trace (templated); by default, and when it renders as unset (``None``,
        blank), every message starts a new one.
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
        data: Mapping[str, Any] | Sequence[Mapping[str, Any]] | str | None = None,
        envelopes: Sequence[Mapping[str, Any] | bytes | str] | Mapping[str, Any] | str | None = None,
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

    def _items(self) -> list[Any]:
        """What this run publishes, read once from the rendered fields: payloads (``urn``/``data``) or ready
        envelopes."""
        return payloads_of(self.data) if self.envelopes is None else ready_envelopes_of(self.envelopes)

    def _bodies(self, items: list[Any], trace_id: str | None = None) -> list[bytes]:
        """:param items: :meth:`_items`.
        :param trace_id: the ``trace_id`` of envelopes built here when the operator names none (the producer
            span's trace while tracing)."""
        if self.envelopes is not None:
            bodies = []
            for index, item in enumerate(items):
                try:
                    env = item if isinstance(item, Mapping) else bq.decode(item)
                except EnvelopeDecodeError as exc:
                    raise ValueError(f"envelopes[{index}] is not an encoded envelope: {exc}") from exc
                reason = bq.check(env)
                if reason is not None:
                    raise ValueError(f"envelopes[{index}] is not publishable: {reason}")
                bodies.append(
                    item if isinstance(item, bytes) else bq.encode(env) if isinstance(item, Mapping) else item.encode()
                )
            return bodies
        urn, trace_id = self.urn, self._trace_id() or trace_id
        assert urn is not None  # __init__ requires urn when envelopes is not given
        if urn.strip() == "None":
            raise _rendered_unset("urn", urn, "give the message's URN")
        return [
            bq.encode(bq.make_envelope(urn, payload, queue_name=self.queue_name, trace_id=trace_id))
            for payload in items
        ]

    def _trace_id(self) -> str | None:
        """The ``trace_id`` to continue: ``None`` (a new trace per message) when the template rendered as unset,
        as ``{{ dag_run.conf.get('trace_id') }}`` does for a run started without one."""
        return None if is_unset(self.trace_id) else self.trace_id

    def _shared_trace_id(self, items: list[Any]) -> str | None:
        """The ``trace_id`` all messages of this call continue, when they share one (the producer span then joins
        that trace); ``None`` when they start new ones or differ."""
        if self.envelopes is None:
            return self._trace_id()
        found = set()
        for item in items:
            try:
                env = item if isinstance(item, Mapping) else bq.decode(item)
            except EnvelopeDecodeError:  # refused with its index by _bodies, inside the span
                return None
            found.add(env.get("trace_id") if isinstance(env.get("trace_id"), str) else None)
        return found.pop() if len(found) == 1 else None

    def _send(self, binding: Binding, bodies: list[bytes], headers: Mapping[str, Any] | None) -> None:
        if len(bodies) == 1:
            binding.publish(bodies[0], self.queue_name, headers=headers or None, delay=self.delay)
        elif bodies:
            if self.delay:
                self.log.warning("delay applies to single messages; the batch of %d is sent now", len(bodies))
            binding.publish_batch(bodies, self.queue_name)

    def execute(self, context: Context) -> list[str]:
        hook = get_hook(self.babelqueue_conn_id)
        started = time.monotonic()
        try:
            binding = hook.get_binding()
            tracer = tracer_for(binding, conn_id=self.babelqueue_conn_id)
            items = self._items()
            if tracer is None:
                bodies = self._bodies(items)
                ids = _meta_ids(bodies)
                self._send(binding, bodies, self.headers)
            else:
                shared = self._shared_trace_id(items)
                with tracer.send(self.queue_name, len(items), trace_id=shared, urn=self.urn) as span:
                    bodies = self._bodies(items, span.trace_id)
                    ids = _meta_ids(bodies)
                    span.message_ids(ids)
                    self._send(binding, bodies, span.headers(self.headers))  # a failure is recorded on the span
        finally:
            hook.close()
        tags = {"conn_id": self.babelqueue_conn_id, "queue_name": self.queue_name}
        metrics.count("published", len(bodies), **tags)
        metrics.timing("publish.duration", time.monotonic() - started, **tags)
        self.log.info("published %d message(s) to %s via %s", len(bodies), self.queue_name, self.babelqueue_conn_id)
        return ids

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage's ``OperatorLineage`` of the run (the provider's listener calls this when the task ended): the
        queue it published to (:func:`~airflow_provider_babelqueue.lineage.publish_lineage`); ``None`` when
        OpenLineage is not installed."""
        from ..lineage import publish_lineage, run_result, to_operator_lineage

        return to_operator_lineage(publish_lineage(self.babelqueue_conn_id, self.queue_name, run_result(task_instance)))
