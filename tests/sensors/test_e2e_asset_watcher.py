"""End to end on a real local Airflow: api-server, scheduler, dag-processor and triggerer on loopback.

A DAG is scheduled on an asset whose AssetWatcher runs BabelQueueDeadLetterTrigger (default settings) against
Redis. A dead letter already waiting before any Airflow component starts (a backlog, as after a pause or a
triggerer restart) must start a DAG run on its own, and a dead letter pushed later must start another; each run's
task must see the trigger's payload (the meta.id we pushed). Slow (a minute or two) but run in CI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig
from tests.conftest import free_port

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




def _wait_until_healthy(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    import urllib.request

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert process.poll() is None, f"api-server exited: {log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    pytest.fail(f"the api-server did not answer within 180 s: {log.read_text()[-3000:]}")


def test_a_backlog_and_a_new_dead_letter_on_redis_each_run_an_asset_scheduled_dag(tmp_path: Path) -> None:
    home, queue, prefix = tmp_path / "airflow", f"e2e-{uuid.uuid4().hex[:8]}", f"bqe2e{uuid.uuid4().hex[:6]}:"
    out = tmp_path / "seen"
    out.mkdir()
    (home / "dags").mkdir(parents=True)
    (home / "dags" / "e2e_dag.py").write_text(textwrap.dedent(DAG_FILE.format(queue=queue, out=str(out))))
    port = free_port()
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
        "AIRFLOW__API__SECRET_KEY": uuid.uuid4().hex,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW_CONN_BQ_E2E": json.dumps(
            {"conn_type": "babelqueue_redis", "host": "127.0.0.1", "port": 6379, "extra": {"key_prefix": prefix}}
        ),
    }
    binding = RedisBinding(RedisConfig(key_prefix=prefix))

    def dead_letter(n: int) -> str:
        binding.publish(bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": n}, queue_name=queue)), queue)
        message = binding.reserve(queue, timeout=2)
        assert message is not None
        binding.dead_letter(message, "failed", error="e2e")
        return message.meta_id

    def runs_seen() -> list[str]:
        return sorted(json.dumps(json.loads(path.read_text())) for path in out.glob("*.json"))

    backlog = dead_letter(0)  # waiting before the triggerer (and its watcher) exists
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=600)
    processes: dict[str, subprocess.Popen[bytes]] = {}
    logs = {name: tmp_path / f"{name}.log" for name in ("api-server", "scheduler", "dag-processor", "triggerer")}
    for name, log in logs.items():
        command = [airflow, name] + (["--port", str(port), "--host", "127.0.0.1"] if name == "api-server" else [])
        processes[name] = subprocess.Popen(
            command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
        )
        if name == "api-server":  # tasks report to it: a run the backlog starts at once needs it up first
            _wait_until_healthy(port, processes[name], log)

    def wait_for_runs(count: int, what: str) -> list[str]:
        deadline = time.monotonic() + 240
        while len(runs_seen()) < count and time.monotonic() < deadline:
            for name, process in processes.items():
                assert process.poll() is None, f"{name} exited: {logs[name].read_text()[-3000:]}"
            time.sleep(1)
        if len(runs_seen()) < count:
            tails = "\n".join(f"--- {n}\n{p.read_text()[-2500:]}" for n, p in logs.items())
            pytest.fail(f"{what}: no asset-triggered run recorded it within 240 s\n{tails}")
        return runs_seen()

    try:
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
        for process in processes.values():
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for process in processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
