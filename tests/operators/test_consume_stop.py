"""A consume task Airflow tells to stop ends at the next message boundary: the handled messages are settled, the
rest of the batch is handed back unhandled and is ready at once (not after the visibility timeout), and the task
fails with :class:`ConsumeStoppedError`. Airflow's supervisor sends the task process SIGTERM; its task runner's
handler calls ``on_kill``: the handler here sends that signal itself, so Airflow's own path runs under dag.test()
on the embedded SQLite queue."""

from __future__ import annotations

import datetime
import signal
import time
import uuid
from collections.abc import Iterator

import pytest
from airflow.sdk import DAG

from airflow_provider_babelqueue.hooks import get_hook
from airflow_provider_babelqueue.operators.consume import BabelQueueConsumeOperator, ConsumeStoppedError
from airflow_provider_babelqueue.operators.publish import BabelQueuePublishOperator
from tests.airflow_harness import run_dag, task_states
from tests.operators import handlers

URN = "urn:babel:orders:created"


@pytest.fixture
def sigterm_restored() -> Iterator[None]:
    """Airflow's task runner installs its SIGTERM handler in this (the test's) process under dag.test()."""
    before = signal.getsignal(signal.SIGTERM)
    handlers.HANDLED.clear()
    yield
    signal.signal(signal.SIGTERM, before)
    handlers.HANDLED.clear()


def test_a_consume_task_told_to_stop_settles_what_it_handled_and_hands_back_the_rest(
        sigterm_restored: None, capfd: pytest.CaptureFixture[str]) -> None:
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    with DAG(f"bq_consume_stop_{uuid.uuid4().hex[:6]}", schedule=None,
             start_date=datetime.datetime(2026, 1, 1)) as dag:
        publish = BabelQueuePublishOperator(task_id="publish", queue_name=queue, urn=URN,
                                            data=[{"order_id": i} for i in range(10)])
        consume = BabelQueueConsumeOperator(task_id="consume", queue_name=queue, batch_size=10,
                                            handlers={URN: "tests.operators.handlers.record_then_terminate_at_third"},
                                            reserve_timeout=0.2, retries=0)
        publish >> consume
    capfd.readouterr()
    run = run_dag(dag)
    out = capfd.readouterr().out
    assert task_states(run) == {"publish": "success", "consume": "failed"}
    assert [env["data"]["order_id"] for env in handlers.HANDLED] == [0, 1, 2]
    assert ConsumeStoppedError.__name__ in out
    assert "3 handled and settled, 7 handed back unhandled" in out
    binding = get_hook("babelqueue_default").get_binding()
    try:
        # ready at once: the embedded queue's visibility timeout is 300 s, and nothing is reserved or lost
        started = time.monotonic()
        back = binding.reserve_many(queue, 10, timeout=0)
        assert time.monotonic() - started < 5
        assert sorted(m.envelope["data"]["order_id"] for m in back if m.envelope) == list(range(3, 10))
        assert all(m.attempts == 0 for m in back)  # handed back, not retried
        binding.ack_many(back)
        assert binding.depth(queue) == 0 and binding.dead_letter_depth(queue) == 0
    finally:
        binding.close()
