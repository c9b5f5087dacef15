"""The console's actions on "everything matching a filter" as background jobs, and the queues' arrivals in the last
hour, through Airflow's own API application (simple auth manager) on the embedded SQLite queue and Redis: a job
reads the whole dead-letter queue in chunks outside the request, its progress is served while it runs, a replay
job replays each dead letter once (a second job skips them through the ledger, a cancelled one is finished by the
next), a discard job archives each part before removing it, an export job's file is served."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.hooks import get_hook
from tests.bindings.conftest import reserve_all
from tests.connections import SPECS
from tests.plugins.common import airflow_api_client
from tests.plugins.test_console_api import Console

pytestmark = pytest.mark.timeout(300)

CONNS = ["bq_jobs_sqlite", "bq_jobs_redis"]
HOUR_MS = 3_600_000


def _fill(conn_id: str, queue: str, count: int) -> list[bytes]:
    """``count`` more dead letters, every third an unknown URN and the rest failed; their stored bodies in order."""
    hook = get_hook(conn_id)
    try:
        binding = hook.get_binding()
        before = binding.dead_letter_depth(queue)
        binding.publish_batch([bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": n}, queue_name=queue))
                               for n in range(count)], queue)
        for message in reserve_all(binding, queue, count, within=60):
            if message.envelope["data"]["n"] % 3 == 2:
                binding.dead_letter(message, bq.Reason.UNKNOWN_URN, error="no handler")
            else:
                binding.dead_letter(message, bq.Reason.FAILED, error="timeout", exception="TimeoutError")
        stored = binding.browse_dead_letter_bytes(queue, before, before + count + 1)
        assert stored is not None and len(stored) == count
        return stored
    finally:
        hook.close()


def _ready(conn_id: str, queue: str) -> int:
    hook = get_hook(conn_id)
    try:
        return hook.get_binding().depth(queue)
    finally:
        hook.close()


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    home = tmp_path_factory.mktemp("jobs")
    with pytest.MonkeyPatch.context() as patch:
        specs: dict[str, Any] = {
            "bq_jobs_sqlite": {"conn_type": "babelqueue+sql", "host": str(home / "queue.sqlite")},
            "bq_jobs_redis": {**SPECS["bq_redis"], "extra": {"key_prefix": f"bqjobs{uuid.uuid4().hex[:6]}:"}},
            "bq_jobs_rabbitmq": SPECS["bq_rabbitmq"],
        }
        for conn_id, spec in specs.items():
            patch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(spec))
        patch.setenv("AIRFLOW__BABELQUEUE__OUTPUT_ROOT", str(home / "runs"))
        client, tokens = airflow_api_client(patch)
        try:
            yield Console(client, tokens, f"orders-{uuid.uuid4().hex[:8]}", {})
        finally:
            from airflow.api_fastapi import app as api_app

            api_app.purge_cached_app()


def _start(console: Console, path: str, conn_id: str, queue: str, **extra: Any) -> dict[str, Any]:
    body = {"conn_id": conn_id, "queue_name": queue, "filter": {"reason": ["failed"]}, "background": True, **extra}
    answer = console.post(path, body)
    assert answer.status_code == 202, answer.text
    job: dict[str, Any] = answer.json()["job"]
    assert job["state"] == "running" and job["conn_id"] == conn_id and job["filter"] == {"reason": ["failed"]}
    return job


def _wait(console: Console, job_id: str, within: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        job: dict[str, Any] = console.get(f"/jobs/{job_id}").json()
        if job["state"] != "running":
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still running after {within} s")


def _events(console: Console, job_id: str) -> dict[str, dict[str, Any]]:
    return {a["action"]: a for a in console.get("/actions", limit=500).json()["actions"]
            if a["details"].get("job") == job_id or (a["action"].endswith("_started")
                                                     and a["details"].get("job") == job_id)}


@pytest.mark.parametrize("conn_id", CONNS)
def test_a_replay_job_replays_every_match_once_and_records_it(console: Console, conn_id: str) -> None:
    queue = console.queue + "-replay"
    _fill(conn_id, queue, 1600)  # more than three chunks of the scan
    failed = sum(1 for n in range(1600) if n % 3 != 2)
    preview = _wait(console, _start(console, "/actions/replay", conn_id, queue)["id"])
    assert preview["state"] == "succeeded", preview
    assert (preview["scanned"], preview["matched"], preview["counts"]["replayed"]) == (1600, failed, failed)
    assert preview["counts"]["dry_run"] is True and _ready(conn_id, queue) == 0
    job = _wait(console, _start(console, "/actions/replay", conn_id, queue, dry_run=False)["id"])
    assert job["state"] == "succeeded", job
    assert (job["depth"], job["scanned"], job["matched"]) == (1600, 1600, failed)
    assert job["counts"]["replayed"] == failed and job["counts"]["ledgers"] == [f"replay:{queue}"]
    assert _ready(conn_id, queue) == failed
    again = _wait(console, _start(console, "/actions/replay", conn_id, queue, dry_run=False)["id"])
    assert (again["counts"]["replayed"], again["counts"]["duplicates_avoided"]) == (0, failed)
    assert _ready(conn_id, queue) == failed
    events = _events(console, job["id"])
    assert set(events) == {"replay_started", "replay"}
    assert events["replay"]["who"] == "op" and events["replay"]["details"]["replayed"] == failed
    assert events["replay"]["details"]["state"] == "succeeded"
    assert events["replay"]["details"]["selection"] == {"filter": {"reason": ["failed"]}}


def test_a_cancelled_replay_job_stops_and_the_next_one_finishes_without_duplicates(console: Console) -> None:
    conn_id, queue = "bq_jobs_redis", console.queue + "-cancel"
    _fill(conn_id, queue, 1600)
    failed = sum(1 for n in range(1600) if n % 3 != 2)
    job = _start(console, "/actions/replay", conn_id, queue, dry_run=False, max_messages_per_second=200)
    time.sleep(2.5)  # the rate cap keeps it running; its progress is written while it runs
    running = console.get(f"/jobs/{job['id']}").json()
    assert running["state"] == "running" and 0 < running["scanned"] and running["stalled"] is False
    assert console.post(f"/jobs/{job['id']}/cancel", {}, user="viewer").status_code == 403
    assert console.post(f"/jobs/{job['id']}/cancel", {}).status_code == 202
    stopped = _wait(console, job["id"])
    assert stopped["state"] == "cancelled" and 0 < stopped["counts"]["replayed"] < failed
    assert console.post(f"/jobs/{job['id']}/cancel", {}).status_code == 409
    rest = _wait(console, _start(console, "/actions/replay", conn_id, queue, dry_run=False)["id"])
    assert rest["counts"]["replayed"] + rest["counts"]["duplicates_avoided"] == failed
    assert _ready(conn_id, queue) == failed  # every failed dead letter is on the queue exactly once


@pytest.mark.parametrize("conn_id", CONNS)
def test_a_discard_job_archives_each_part_before_removing_it(console: Console, conn_id: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_babelqueue.core.records import record_body
    from airflow_provider_babelqueue.plugins import actions

    monkeypatch.setattr(actions, "MAX_ITEMS", 400)  # parts of 400, so 1,067 matches make three archive files
    queue = console.queue + "-discard"
    stored = _fill(conn_id, queue, 1600)
    matched = [body for n, body in enumerate(stored) if n % 3 != 2]
    job = _wait(console, _start(console, "/actions/discard", conn_id, queue)["id"])
    assert job["state"] == "succeeded", job
    assert (job["counts"]["archived"], job["counts"]["discarded"]) == (len(matched), len(matched))
    archives = [Path(p) for p in job["counts"]["archives"]]
    assert len(archives) == 3 and all(p.parent == Path(job["output"]) for p in archives)
    archived = [record_body(json.loads(line)) for path in archives for line in path.read_bytes().splitlines()]
    assert archived == matched
    left = console.get("/dead-letters", conn_id=conn_id, queue_name=queue, limit=1000).json()
    assert left["depth"] == 1600 - len(matched)
    assert all(entry["reason"] == "unknown_urn" for entry in left["entries"])


@pytest.mark.parametrize("conn_id", CONNS)
def test_an_export_job_writes_its_records_and_serves_them(console: Console, conn_id: str) -> None:
    from airflow_provider_babelqueue.core.records import record_body

    queue = console.queue + "-export"
    stored = _fill(conn_id, queue, 700)
    job = _wait(console, _start(console, "/actions/export", conn_id, queue)["id"])
    assert job["state"] == "succeeded" and job["counts"]["exported"] == sum(1 for n in range(700) if n % 3 != 2)
    assert console.get(f"/jobs/{job['id']}/file", user="viewer").status_code == 403
    served = console.client.get(f"/babelqueue/console/api/jobs/{job['id']}/file",
                                headers={"Authorization": f"Bearer {console.tokens['op']}"})
    assert served.status_code == 200 and served.headers["content-type"] == "application/x-ndjson"
    assert served.content == Path(job["output"]).read_bytes()
    assert [record_body(json.loads(line)) for line in served.content.splitlines()] == [
        body for n, body in enumerate(stored) if n % 3 != 2]
    listed = [j["id"] for j in console.get("/jobs").json()["jobs"]]
    assert job["id"] in listed


def test_jobs_refuse_what_they_cannot_do(console: Console) -> None:
    rabbit = {"conn_id": "bq_jobs_rabbitmq", "queue_name": "jobs-empty", "filter": {}, "background": True}
    refused = console.post("/actions/replay", rabbit)
    assert refused.status_code == 409 and "without taking its messages" in refused.json()["detail"]
    selection = {"conn_id": "bq_jobs_redis", "queue_name": "q", "positions": [0], "meta_ids": [None],
                 "background": True}
    assert console.post("/actions/export", selection).status_code == 422
    assert console.post("/actions/replay", {**rabbit, "conn_id": "bq_jobs_redis"}, user="viewer").status_code == 403
    assert console.get("/jobs", user=None).status_code == 401
    assert console.get("/jobs/" + "0" * 32).status_code == 404
    assert console.get("/jobs/not-a-job").status_code == 422


@pytest.mark.parametrize("conn_id", CONNS)
def test_queues_count_the_dead_letters_of_the_last_hour(console: Console, conn_id: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_babelqueue.core import envelope

    queue = console.queue + "-recent"
    now = envelope.now_ms()
    # The clock is moved back for the first dead letters: waiting two hours is not a test.
    monkeypatch.setattr(envelope, "now_ms", lambda: now - 2 * HOUR_MS)
    _fill(conn_id, queue, 5)
    monkeypatch.setattr(envelope, "now_ms", lambda: now)
    _fill(conn_id, queue, 3)
    [row] = console.get("/queues", conn_id=conn_id, queue_name=[queue]).json()["queues"]
    assert (row["dead_letter_depth"], row["dead_letters_last_hour"], row["dead_letters_last_hour_whole"]) == (8, 3,
                                                                                                            True)
    assert row["oldest_failed_at"] == now - 2 * HOUR_MS and row["can_discard"] is True


def test_jobs_keep_their_state_and_files_in_object_storage(console: Console, monkeypatch: pytest.MonkeyPatch) -> None:
    """An output root in object storage (fsspec's in-memory file system, registered for the test as a provider
    registers its scheme: Airflow's registry has no ``memory`` scheme of its own): the job files, an export's
    records and a discard's archive land there."""
    import fsspec
    from airflow.sdk import ObjectStoragePath
    from airflow.sdk.io import fs as airflow_fs

    monkeypatch.setitem(airflow_fs._register_filesystems(), "memory", lambda conn_id: fsspec.filesystem("memory"))

    from airflow_provider_babelqueue.core.records import record_body

    root = f"memory://bq-console-{uuid.uuid4().hex[:8]}/runs"
    monkeypatch.setenv("AIRFLOW__BABELQUEUE__OUTPUT_ROOT", root)
    conn_id, queue = "bq_jobs_sqlite", console.queue + "-remote"
    stored = _fill(conn_id, queue, 30)
    failed = [body for n, body in enumerate(stored) if n % 3 != 2]
    export = _wait(console, _start(console, "/actions/export", conn_id, queue)["id"])
    assert export["state"] == "succeeded", export["error"]
    assert export["output"].startswith(f"{root}/console/{conn_id}/")
    served = console.client.get(f"/babelqueue/console/api/jobs/{export['id']}/file",
                                headers={"Authorization": f"Bearer {console.tokens['op']}"})
    assert [record_body(json.loads(line)) for line in served.content.splitlines()] == failed
    assert ObjectStoragePath(f"{root}/console/jobs/{export['id']}.json").exists()
    discard = _wait(console, _start(console, "/actions/discard", conn_id, queue)["id"])
    assert discard["state"] == "succeeded" and discard["counts"]["discarded"] == len(failed)
    [archive] = discard["counts"]["archives"]
    assert [record_body(json.loads(line)) for line in ObjectStoragePath(archive).read_bytes().splitlines()] == failed
    assert [job["id"] for job in console.get("/jobs").json()["jobs"]] == [discard["id"], export["id"]]


def test_a_job_that_fails_says_why(console: Console, monkeypatch: pytest.MonkeyPatch) -> None:
    """The output root cannot be written (a file stands where its folder would be): the export job fails, its
    state and the audit log say why, and nothing was taken from the queue."""
    conn_id, queue = "bq_jobs_redis", console.queue + "-fails"
    stored = _fill(conn_id, queue, 10)
    blocked = Path(json.loads(os.environ["AIRFLOW_CONN_BQ_JOBS_SQLITE"])["host"]).parent / "blocked"
    blocked.write_text("a file, not a folder")
    monkeypatch.setenv("AIRFLOW__BABELQUEUE__OUTPUT_ROOT", str(blocked))
    refused = console.post("/actions/export", {"conn_id": conn_id, "queue_name": queue, "filter": {},
                                               "background": True})
    assert refused.status_code == 500 and "output_root" in refused.json()["detail"]  # no job file: no job
    monkeypatch.setenv("AIRFLOW__BABELQUEUE__OUTPUT_ROOT", str(blocked.parent / "runs-ok"))
    (blocked.parent / "runs-ok" / "console").mkdir(parents=True, exist_ok=True)
    (blocked.parent / "runs-ok" / "console" / conn_id).write_text("a file where the export's folder goes")
    job = _wait(console, _start(console, "/actions/export", conn_id, queue)["id"])
    assert job["state"] == "failed" and job["error"].startswith(("NotADirectoryError", "FileExistsError")), job
    [event] = [a for a in console.get("/actions", limit=500).json()["actions"]
               if a["action"] == "export" and a["details"].get("job") == job["id"]]
    assert event["details"]["state"] == "failed" and event["details"]["error"] == job["error"]
    hook = get_hook(conn_id)
    try:
        assert hook.get_binding().browse_dead_letter_bytes(queue, 0, 100) == stored  # nothing taken
    finally:
        hook.close()
