"""End to end on a real local Airflow: api-server, scheduler, dag-processor and triggerer on loopback.

A DAG is scheduled on an asset whose AssetWatcher runs BabelQueueDeadLetterTrigger against Redis. A dead
letter pushed to Redis must produce a DAG run whose task sees the trigger's payload (the meta.id we
pushed). Slow (a minute or two) but run in CI.
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
    def record(triggering_asset_events=None):
        extras = [event.extra for events in triggering_asset_events.values() for event in events]
        Path({out!r}).write_text(json.dumps(extras, default=str))

    record()
"""




def test_a_dead_letter_on_redis_runs_an_asset_scheduled_dag(tmp_path: Path) -> None:
    home, queue, prefix = tmp_path / "airflow", f"e2e-{uuid.uuid4().hex[:8]}", f"bqe2e{uuid.uuid4().hex[:6]}:"
    out = tmp_path / "seen.json"
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
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=600)
    processes: dict[str, subprocess.Popen[bytes]] = {}
    logs = {name: tmp_path / f"{name}.log" for name in ("api-server", "scheduler", "dag-processor", "triggerer")}
    for name, log in logs.items():
        command = [airflow, name] + (["--port", str(port), "--host", "127.0.0.1"] if name == "api-server" else [])
        processes[name] = subprocess.Popen(
            command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
        )
    binding = RedisBinding(RedisConfig(key_prefix=prefix))
    pushed: list[str] = []
    try:
        deadline = time.monotonic() + 300
        next_push = time.monotonic() + 20  # let the components start and the watcher take its baseline
        while not out.exists() and time.monotonic() < deadline:
            for name, process in processes.items():
                assert process.poll() is None, f"{name} exited: {logs[name].read_text()[-3000:]}"
            if time.monotonic() >= next_push:
                body = bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": len(pushed)}, queue_name=queue))
                binding.publish(body, queue)
                message = binding.reserve(queue, timeout=2)
                binding.dead_letter(message, "failed", error="e2e")
                pushed.append(message.meta_id)
                next_push = time.monotonic() + 15
            time.sleep(1)
        if not out.exists():
            tails = "\n".join(f"--- {n}\n{p.read_text()[-2500:]}" for n, p in logs.items())
            pytest.fail(f"no asset-triggered run recorded the event within 300 s (pushed {pushed})\n{tails}")
        time.sleep(1)  # the task writes the file in one call; give the filesystem a moment
        seen = json.loads(out.read_text())
        text = json.dumps(seen)
        assert pushed and any(meta_id in text for meta_id in pushed), seen
        assert queue in text and '"reason": "failed"' in text
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
