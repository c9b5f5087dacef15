"""End to end on a real local Airflow: api-server, scheduler, dag-processor and triggerer on loopback.

A DAG is scheduled on an asset whose AssetWatcher runs BabelQueueDeadLetterTrigger (default settings) against
Redis. A dead letter already waiting before any Airflow component starts (a backlog, as after a pause or a
triggerer restart) must start a DAG run on its own, and a dead letter pushed later must start another; each run's
task must see the trigger's payload (the meta.id we pushed). Slow (a minute or two) but run in CI.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig
from tests.local_airflow import LocalAirflow, connection_env

pytestmark = pytest.mark.slow

DAG_FILE = """
import json
from pathlib import Path

from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_provider_babelqueue.triggers import BabelQueueDeadLetterTrigger

watcher = AssetWatcher(
    name="dead_letters",
    trigger=BabelQueueDeadLetterTrigger(babelqueue_conn_id="bq_e2e", queue_name={queue!r}, poll_interval=1),
)

with DAG("bq_e2e_dead_letters", schedule=[Asset("babelqueue://e2e/dead-letters", watchers=[watcher])]):

    @task
    def record(triggering_asset_events=None, run_id=None):
        extras = [event.extra for events in triggering_asset_events.values() for event in events]
        out = Path({out!r}) / (run_id.replace(":", "_") + ".json")
        out.with_suffix(".tmp").write_text(json.dumps(extras, default=str))
        out.with_suffix(".tmp").rename(out)

    record()
"""




def test_a_backlog_and_a_new_dead_letter_on_redis_each_run_an_asset_scheduled_dag(tmp_path: Path) -> None:
    queue, prefix = f"e2e-{uuid.uuid4().hex[:8]}", f"bqe2e{uuid.uuid4().hex[:6]}:"
    out = tmp_path / "seen"
    out.mkdir()
    connection = {"conn_type": "babelqueue_redis", "host": "127.0.0.1", "port": 6379, "extra": {"key_prefix": prefix}}
    airflow = LocalAirflow(tmp_path, {"e2e_dag.py": DAG_FILE.format(queue=queue, out=str(out))},
                           connection_env("bq_e2e", connection))
    binding = RedisBinding(RedisConfig(key_prefix=prefix))

    def dead_letter(n: int) -> str:
        binding.publish(bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": n}, queue_name=queue)), queue)
        message = binding.reserve(queue, timeout=2)
        assert message is not None
        binding.dead_letter(message, "failed", error="e2e")
        return message.meta_id

    def runs_seen() -> list[str]:
        return sorted(json.dumps(json.loads(path.read_text())) for path in out.glob("*.json"))

    def wait_for_runs(count: int, what: str) -> list[str]:
        deadline = time.monotonic() + 240
        while len(runs_seen()) < count and time.monotonic() < deadline:
            airflow.check_alive()
            time.sleep(1)
        if len(runs_seen()) < count:
            pytest.fail(f"{what}: no asset-triggered run recorded it within 240 s\n{airflow.tails()}")
        return runs_seen()

    backlog = dead_letter(0)  # waiting before the triggerer (and its watcher) exists
    try:
        with airflow:
            first = wait_for_runs(1, f"the backlog {backlog}")
            assert len(first) == 1 and backlog in first[0] and queue in first[0] and '"reason": "failed"' in first[0]
            arrival = dead_letter(1)  # the watcher keeps polling after its event: a new dead letter fires again
            runs = wait_for_runs(2, f"the new dead letter {arrival}")
            assert len(runs) == 2 and sum(arrival in run for run in runs) == 1, runs
            new = next(run for run in runs if arrival in run)
            assert '"new": 1' in new and '"depth": 2' in new, new
    finally:
        binding.client.delete(*(binding.client.keys(f"{prefix}*") or [f"{prefix}none"]))
        binding.close()
