"""At least once, broker to asset event, on a real local Airflow whose triggerer is SIGKILLed while messages arrive.

One DAG per broker (SQLite, PostgreSQL, Redis, RabbitMQ, SQS on moto) is scheduled on an asset whose
``AssetWatcher`` runs ``BabelQueueMessageTrigger``; each run's task records the ``meta.id`` of every message in its
triggering asset events. Messages are published in waves; between waves the triggerer (its supervisor and runner
together) is SIGKILLed and started again. Every published ``meta.id`` must appear in some run (0 lost); a message
whose event was not stored when the triggerer died is handed out again, so duplicates are possible: they are
counted and reported (``duplicates.json`` beside the logs, and the test's output).

Sizes: ``BQ_TRIGGER_MESSAGES`` per broker (CI: 100) and ``BQ_TRIGGER_KILLS`` (CI: 3); the full run is
``make crash-trigger`` (1,000 messages and 20 kills per broker). ``BQ_TRIGGER_BROKERS`` picks brokers.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import threading
import time
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding
from tests.local_airflow import LocalAirflow, connection_env

pytestmark = pytest.mark.slow

MESSAGES = int(os.environ.get("BQ_TRIGGER_MESSAGES", "100"))
KILLS = int(os.environ.get("BQ_TRIGGER_KILLS", "3"))
BROKERS = os.environ.get("BQ_TRIGGER_BROKERS", "sqlite,postgresql,redis,rabbitmq,sqs").split(",")
#: Seconds a reservation of a killed triggerer stays hidden on brokers where it does not live on the connection.
VISIBILITY = 10
#: Seconds the trigger holds a reservation while its event is on its way (``reservation_timeout``; 600 by default):
#: after a kill, the messages of the dead triggerer come back when it runs out.
RESERVATION = 30

DAG_FILE = """
import json
from pathlib import Path

from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_provider_babelqueue.triggers import BabelQueueMessageTrigger

for broker, queue in {queues!r}.items():
    watcher = AssetWatcher(
        name=f"messages_{{broker}}",
        trigger=BabelQueueMessageTrigger(babelqueue_conn_id=f"bq_{{broker}}", queue_name=queue, reserve_timeout=1,
                                         reservation_timeout={reservation}),
    )
    with DAG(f"bq_messages_{{broker}}", schedule=[Asset(f"babelqueue://bq_{{broker}}/{{queue}}", watchers=[watcher])],
             max_active_runs=4) as dag:

        @task
        def record(broker=broker, triggering_asset_events=None, run_id=None):
            ids = [entry["meta_id"] for events in triggering_asset_events.values() for event in events
                   for entry in event.extra["payload"]["messages"]]
            out = Path({out!r}) / broker
            out.mkdir(exist_ok=True)
            path = out / (run_id.replace(":", "_").replace("+", "_") + ".json")
            path.with_suffix(".tmp").write_text(json.dumps(ids))
            path.with_suffix(".tmp").rename(path)

        record()
    globals()[f"dag_{{broker}}"] = dag
"""


def connections(tmp_path: Path) -> dict[str, dict[str, Any]]:
    """The Airflow connection (JSON form) for each broker, with a short visibility timeout where one applies."""
    from tests.bindings.sqs_server import REGION, moto_endpoint

    specs: dict[str, dict[str, Any]] = {
        "sqlite": {"conn_type": "babelqueue+sql", "host": str(tmp_path / "queue.sqlite"),
                   "extra": {"visibility_timeout": VISIBILITY}},
        "postgresql": {"conn_type": "babelqueue+sql", "host": "127.0.0.1", "port": 5432, "login": "postgres",
                       "schema": "test", "extra": {"dialect": "postgresql", "table": f"e2e_{uuid.uuid4().hex[:8]}",
                                                   "visibility_timeout": VISIBILITY}},
        "redis": {"conn_type": "babelqueue+redis", "host": "127.0.0.1", "port": 6379,
                  "extra": {"key_prefix": f"bqmsg{uuid.uuid4().hex[:6]}:", "visibility_timeout": VISIBILITY}},
        "rabbitmq": {"conn_type": "babelqueue+rabbitmq", "host": "127.0.0.1", "port": 5672, "login": "guest",
                     "password": "guest"},
    }
    if "sqs" in BROKERS:
        specs["sqs"] = {"conn_type": "babelqueue+sqs", "login": "testing", "password": "testing",
                        "extra": {"region_name": REGION, "endpoint_url": moto_endpoint(), "create_queues": True,
                                  "visibility_timeout": VISIBILITY}}
    return {broker: specs[broker] for broker in BROKERS}


def binding_for(conn_id: str, spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Binding:
    """The test's own binding on the same connection (through the hook, as a task would get it)."""
    from airflow_provider_babelqueue.hooks import get_hook

    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(spec))
    return get_hook(conn_id).get_binding()


def stored_events(home: Path) -> int:
    """Asset events in the metadata database (the triggerer's events once stored)."""
    with closing(sqlite3.connect(home / "airflow.db", timeout=30)) as db:
        return int(db.execute("SELECT count(*) FROM asset_event").fetchone()[0])


def test_no_message_is_lost_while_the_triggerer_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "seen"
    out.mkdir()
    specs = connections(tmp_path)
    queues = {broker: f"e2e-msg-{broker}-{uuid.uuid4().hex[:6]}" for broker in specs}
    env: dict[str, str] = {
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "5",
        "AIRFLOW__SCHEDULER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "5",
        # shorter than the held reservations, as the defaults are (300 s and 600 s)
        "AIRFLOW__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT": str(RESERVATION * 2 // 3),
    }
    for broker, spec in specs.items():
        env.update(connection_env(f"bq_{broker}", spec))
    bindings = {broker: binding_for(f"bq_{broker}", spec, monkeypatch) for broker, spec in specs.items()}
    published: dict[str, list[str]] = {broker: [] for broker in specs}
    ticks: dict[str, list[str]] = {broker: [] for broker in specs}
    rng = random.Random(31)

    def publish(into: dict[str, list[str]]) -> None:
        for broker, binding in bindings.items():
            envelope = bq.make_envelope("urn:babel:orders:created", {"n": len(into[broker])},
                                        queue_name=queues[broker])
            binding.publish(bq.encode(envelope), queues[broker])
            into[broker].append(envelope["meta"]["id"])

    def seen() -> dict[str, list[str]]:
        return {broker: [i for path in sorted((out / broker).glob("*.json")) for i in json.loads(path.read_text())]
                for broker in specs}

    def missing() -> dict[str, set[str]]:
        got = seen()
        return {broker: set(ids) - set(got[broker]) for broker, ids in published.items()}

    # a steady stream over the kills: each restart takes ~20 s (start-up, then the dead one's triggers move over)
    interval = max(0.05, 20.0 * (KILLS + 1) / MESSAGES)
    stop_publishing = threading.Event()

    def publisher() -> None:
        while len(published[next(iter(specs))]) < MESSAGES and not stop_publishing.is_set():
            publish(published)
            time.sleep(interval)

    airflow = LocalAirflow(tmp_path, {"messages.py": DAG_FILE.format(queues=queues, out=str(out),
                                                                      reservation=RESERVATION)}, env)
    thread = threading.Thread(target=publisher, daemon=True)
    try:
        with airflow:
            thread.start()
            for kill in range(1, KILLS + 1):
                before, deadline = stored_events(airflow.home), time.monotonic() + 180
                while stored_events(airflow.home) < before + 3 and time.monotonic() < deadline:  # it is reading
                    airflow.check_alive()
                    time.sleep(0.5)
                time.sleep(rng.uniform(0.0, 1.5))  # mid-stream: some events stored, some in flight
                print(f"{time.strftime('%H:%M:%S')} kill {kill}/{KILLS}: triggerer after {stored_events(airflow.home)} "
                      "stored events", flush=True)
                airflow.kill("triggerer")
                time.sleep(rng.uniform(0.0, 2.0))
                airflow.start("triggerer")
            thread.join(timeout=MESSAGES * interval + 120)
            # Airflow starts a run for the events queued when it creates one; events stored a moment later wait for
            # the next event (docs/events.md): a tick now and then stands for the traffic that would follow
            deadline = time.monotonic() + 240 + MESSAGES * len(specs) * 0.1
            while any(missing().values()) and time.monotonic() < deadline:
                airflow.check_alive()
                publish(ticks)
                time.sleep(5)
            lost = {broker: sorted(ids) for broker, ids in missing().items() if ids}
            got = seen()
            duplicates = {broker: len(got[broker]) - len(set(got[broker])) for broker in specs}
            report = {"messages_per_broker": MESSAGES, "kills": KILLS, "lost": {b: len(i) for b, i in lost.items()},
                      "duplicates": duplicates}
            (tmp_path / "duplicates.json").write_text(json.dumps(report, indent=1))
            print(f"message trigger under {KILLS} triggerer kills: {json.dumps(report)}")
            assert not lost, f"lost {json.dumps({b: ids[:5] for b, ids in lost.items()})}\n{airflow.tails()}"
            assert all(set(got[b]) <= set(published[b]) | set(ticks[b]) for b in specs)  # nothing else
    finally:
        stop_publishing.set()
        for binding in bindings.values():
            binding.close()


RUN_FINISHED_DAG = """
import json
from pathlib import Path

from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_provider_babelqueue.operators import BabelQueueSettleRunOperator
from airflow_provider_babelqueue.triggers import BabelQueueMessageTrigger
from airflow_provider_babelqueue.triggers.messages import envelopes_from

for broker, queue in {queues!r}.items():
    watcher = AssetWatcher(name=f"run_settled_{{broker}}", trigger=BabelQueueMessageTrigger(
        babelqueue_conn_id=f"bq_{{broker}}", queue_name=queue, reserve_timeout=1, settle="run_finished",
        run_timeout=600))
    asset = Asset(f"babelqueue://bq_{{broker}}/{{queue}}", watchers=[watcher])
    with DAG(f"bq_run_settled_{{broker}}", schedule=[asset], max_active_runs=1) as dag:

        @task
        def work(broker=broker, triggering_asset_events=None, run_id=None):
            envelopes = envelopes_from(triggering_asset_events)
            out = Path({out!r}) / broker
            out.mkdir(exist_ok=True)
            failing = [e for e in envelopes if e["data"].get("fail_once")
                       and not (out / ("failed-" + e["meta"]["id"])).exists()]
            for e in failing:
                (out / ("failed-" + e["meta"]["id"])).touch()
            (out / (run_id.replace(":", "_").replace("+", "_") + ".json")).write_text(json.dumps(
                {{"ids": [e["meta"]["id"] for e in envelopes], "failed": bool(failing)}}))
            if failing:
                raise RuntimeError("this run fails: its messages must come back")

        work() >> BabelQueueSettleRunOperator(task_id="settle")
    globals()[f"dag_{{broker}}"] = dag
"""


def test_a_failed_run_hands_its_message_back_and_a_new_run_takes_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``settle="run_finished"`` where a run can settle (SQLite, PostgreSQL, Redis here; SQS in-process): the run
    that fails hands its message back, the next run succeeds with it; every message ends acked by its run."""
    out = tmp_path / "seen"
    out.mkdir()
    settling = ("sqlite", "postgresql", "redis")
    specs = {broker: spec for broker, spec in connections(tmp_path).items() if broker in settling}
    queues = {broker: f"e2e-run-{broker}-{uuid.uuid4().hex[:6]}" for broker in specs}
    env: dict[str, str] = {}
    for broker, spec in specs.items():
        env.update(connection_env(f"bq_{broker}", spec))
    bindings = {broker: binding_for(f"bq_{broker}", spec, monkeypatch) for broker, spec in specs.items()}
    airflow = LocalAirflow(tmp_path, {"run_settled.py": RUN_FINISHED_DAG.format(queues=queues, out=str(out))}, env)

    def runs(broker: str) -> list[dict[str, Any]]:
        return [json.loads(path.read_text()) for path in sorted((out / broker).glob("*.json"))]

    try:
        with airflow:
            reading, deadline = airflow.logs["triggerer"], time.monotonic() + 120
            while not all(f"reading messages of {q}" in reading.read_text() for q in queues.values()):
                assert time.monotonic() < deadline, airflow.tails()
                airflow.check_alive()
                time.sleep(1)
            ids: dict[str, list[str]] = {broker: [] for broker in bindings}
            for n in range(3):  # one message per broker at a time: each makes its own run of its broker's DAG
                for broker, binding in bindings.items():
                    envelope = bq.make_envelope("urn:babel:orders:created", {"n": n, "fail_once": n == 1},
                                                queue_name=queues[broker])
                    binding.publish(bq.encode(envelope), queues[broker])
                    ids[broker].append(envelope["meta"]["id"])
                time.sleep(4)
            deadline, ticks = time.monotonic() + 300, {broker: set() for broker in specs}
            while time.monotonic() < deadline:
                airflow.check_alive()
                done = {b: {i for r in runs(b) if not r["failed"] for i in r["ids"]} for b in specs}
                if all(set(ids[b]) <= done[b] for b in specs):
                    break
                time.sleep(4)
                for broker, binding in bindings.items():  # the next event starts the run for any left waiting
                    tick = bq.make_envelope("urn:babel:orders:created", {"tick": True}, queue_name=queues[broker])
                    binding.publish(bq.encode(tick), queues[broker])
                    ticks[broker].add(tick["meta"]["id"])
            for broker, binding in bindings.items():
                history = runs(broker)
                failed = [r for r in history if r["failed"]]
                # the failing message failed one run (with whatever Airflow put in that run beside it) ...
                assert [ids[broker][1] in r["ids"] for r in failed] == [True], (broker, history, airflow.tails())
                succeeded = [i for r in history if not r["failed"] for i in r["ids"] if i not in ticks[broker]]
                # ... came back, and every message ends in exactly one successful run
                assert sorted(succeeded) == sorted(ids[broker]), (broker, history)
                left = binding.reserve_many(queues[broker], 10, timeout=0.5)  # all acked by their runs (but ticks)
                assert {m.meta_id for m in left} <= ticks[broker], (broker, [m.meta_id for m in left])
    finally:
        for binding in bindings.values():
            binding.close()
