"""The documented metrics reach a StatsD server (a UDP socket on loopback) with exact counts for known DAG runs.

Airflow's StatsD client is configured as a deployment configures it (``[metrics] statsd_on``, host, port) and
initialised the way Airflow's task runner initialises it; the runs are real ``dag.test()`` runs on real brokers.
"""

from __future__ import annotations

import datetime
import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from airflow.sdk import DAG

from airflow_provider_babelqueue.operators.consume import BabelQueueConsumeOperator
from airflow_provider_babelqueue.operators.drain import BabelQueueDrainDeadLettersOperator
from airflow_provider_babelqueue.operators.publish import BabelQueuePublishOperator
from airflow_provider_babelqueue.operators.replay import BabelQueueReplayOperator
from tests.airflow_harness import run_dag, task_states
from tests.connections import define


class StatsdListener:
    """Collects the StatsD lines sent to a loopback UDP port."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []

    def collect(self, quiet: float = 0.3) -> list[str]:
        """Read until nothing arrived for ``quiet`` seconds."""
        last = time.monotonic()
        while time.monotonic() - last < quiet:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            self.lines.extend(data.decode().splitlines())
            last = time.monotonic()
        return self.lines

    def counters(self) -> Counter[str]:
        """Our counters, summed by name (``airflow.`` prefix removed)."""
        totals: Counter[str] = Counter()
        for line in self.collect():
            name, _, rest = line.partition(":")
            value, _, kind = rest.partition("|")
            if kind.startswith("c") and name.startswith("airflow.babelqueue."):
                totals[name.removeprefix("airflow.")] += int(value)
        return totals

    def names(self, kind: str) -> set[str]:
        return {line.partition(":")[0].removeprefix("airflow.") for line in self.lines
                if line.partition("|")[2].startswith(kind) and line.startswith("airflow.babelqueue.")}


@pytest.fixture
def statsd(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatsdListener]:
    from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    listener = StatsdListener()
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PORT", str(listener.port))
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
    try:
        yield listener
    finally:
        stats.initialize(factory=NoStatsLogger, export_legacy_names=True)
        listener.sock.close()


@pytest.mark.parametrize("conn", ["babelqueue_default", "bq_redis"])
def test_a_known_run_sends_exact_counts(conn: str, statsd: StatsdListener, monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    conn_id = define(monkeypatch, conn)
    queue = f"metered-{uuid.uuid4().hex[:8]}"
    with DAG(f"bq_metrics_{uuid.uuid4().hex[:8]}", schedule=None, start_date=datetime.datetime(2026, 1, 1)) as dag:
        one = BabelQueuePublishOperator(task_id="publish_one", babelqueue_conn_id=conn_id, queue_name=queue,
                                        urn="urn:babel:orders:created", data={"order_id": 1})
        batch = BabelQueuePublishOperator(task_id="publish_batch", babelqueue_conn_id=conn_id, queue_name=queue,
                                          urn="urn:babel:orders:created", data=[{"order_id": i} for i in range(4)])
        bad = BabelQueuePublishOperator(task_id="publish_bad", babelqueue_conn_id=conn_id, queue_name=queue,
                                        urn="urn:babel:orders:refund", data=[{"order_id": 8}, {"order_id": 9}])
        unknown = BabelQueuePublishOperator(task_id="publish_unknown", babelqueue_conn_id=conn_id,
                                            queue_name=queue, urn="urn:babel:orders:nobody", data={"order_id": 10})
        consume = BabelQueueConsumeOperator(
            task_id="consume", babelqueue_conn_id=conn_id, queue_name=queue, max_attempts=2, backoff="fixed",
            backoff_base=0, reserve_timeout=0.5,
            handlers={"urn:babel:orders:created": "tests.operators.handlers.record",
                      "urn:babel:orders:refund": "tests.operators.handlers.always_fail"})
        drain = BabelQueueDrainDeadLettersOperator(task_id="drain", babelqueue_conn_id=conn_id, queue_name=queue,
                                                   destination=str(tmp_path / "drained"), reserve_timeout=0.5)
        replay = BabelQueueReplayOperator(task_id="replay", source_conn_id=conn_id,
                                          replay_set=str(tmp_path / "drained"), target_queue_name=queue + "-again",
                                          urns=["urn:babel:orders:refund"])
        one >> batch >> bad >> unknown >> consume >> drain >> replay
    run = run_dag(dag)
    assert task_states(run) == {t: "success" for t in ("publish_one", "publish_batch", "publish_bad",
                                                       "publish_unknown", "consume", "drain", "replay")}
    counts = statsd.counters()
    assert counts == {
        "babelqueue.published": 8,
        "babelqueue.consumed": 10,  # 8 deliveries, the two failing ones twice (max_attempts=2)
        "babelqueue.handled": 5,
        "babelqueue.retried": 2,
        "babelqueue.dead_lettered.failed": 2,
        "babelqueue.dead_lettered.unknown_urn": 1,
        "babelqueue.drained": 3,
        "babelqueue.replayed": 2,
        "babelqueue.replay_skipped.not_selected": 1,
    }, counts
    assert {"babelqueue.publish.duration", "babelqueue.consume.duration"} <= statsd.names("ms")
