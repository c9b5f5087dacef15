"""The pipelined move: drain through a binding's dead-letter pipeline, the broker working while Python does.

A binding that offers the typed optional capability :class:`~...bindings.base.DeadLetterPipeline` (Redis)
lets the drain send the reservation of the next batch before this batch's records are written and synced, and
send a durable batch's ack without waiting for its reply. The fsync runs on a thread while the next batch's
records are built. Up to three batches are then held unacked at once; each comes back after the visibility
timeout on a crash.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from ...bindings.base import Binding, DeadLetterPipeline, PipelinedBatch
from ...bindings.message import ReceivedMessage
from ...core.records import RecordTemplate

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .loop import DrainSource, _Drain

__all__ = ["Piped", "move_pipelined"]


class Piped:
    """One reservation batch received from a binding's dead-letter pipeline (``open_dead_letter_pipeline``,
    Redis): raw values, acked through the pipeline without waiting, messages built only to release them."""

    __slots__ = ("binding", "pipeline", "batch")

    def __init__(self, binding: Binding, pipeline: DeadLetterPipeline, batch: PipelinedBatch) -> None:
        self.binding, self.pipeline, self.batch = binding, pipeline, batch

    def __len__(self) -> int:
        return len(self.batch)

    def held(self, start: int, stop: int) -> Sequence[ReceivedMessage]:
        return self.batch.messages(start, stop)


def move_pipelined(run: _Drain, source: DrainSource, pipeline: DeadLetterPipeline,
                   template: RecordTemplate) -> None:
    """Move through a dead-letter pipeline: the reservation of the next batch is sent before this batch's
    records are written and synced, and a durable batch's ack is sent without waiting for its reply, so
    the broker works while Python does. The pipeline offers ``request(limit) -> asked``, ``receive() ->
    batch`` (``raws``, ``requested``, ``messages(start, stop)``), ``ack(batch, start, stop)``,
    ``reservations_in_flight``, ``finish()`` and ``abort() -> messages to release``.

    Reserving ahead keeps the drain at-least-once: a batch reserved and not yet acked comes back after the
    visibility timeout if the process dies, and is released at once on an error. It never reserves past
    ``max_messages`` (the next batch is at most what is left after the one in hand); with ``max_bytes``
    it does not reserve ahead (how many fit depends on the records of the batch in hand). On a durable sink
    the source ends with its records durable and acked, and the pipeline closed; on object storage the
    pipeline stays open until :meth:`_Drain.finish` has closed the sink and sent the acks."""
    run.pipelines.append(pipeline)
    ahead = run.max_bytes is None
    if run.sink.durable_batches:
        run.syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="babelqueue-drain-sync")
    pipeline.request(run.reserve_limit())
    while pipeline.reservations_in_flight:
        received = pipeline.receive()
        exhausted = len(received.raws) < received.requested
        if ahead and not exhausted:
            limit = run.batch_records
            if run.max_messages is not None:
                limit = min(limit, run.max_messages - run.result.records - len(received.raws))
            if limit > 0:
                pipeline.request(limit)
        if received.raws:
            run.add_batch(source, Piped(source.binding, pipeline, received), template)
            run.hand = None
        if run.full or run.count_full():
            break
        if not exhausted and not pipeline.reservations_in_flight:
            pipeline.request(run.reserve_limit())
    run.flush()
    run.settle_sync()
    run.stop_syncer()
    if run.sink.durable_batches:
        run.close_pipelines()
