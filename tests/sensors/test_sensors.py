"""Both sensors in every mode (poke, reschedule, deferrable) inside real DAGs under dag.test(), which runs
deferred triggers inline. Messages arrive from a background thread after the DAG started."""

from __future__ import annotations

import datetime
import threading
import time
import uuid

import pytest
from airflow.sdk import DAG

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.hooks import get_hook
from airflow_provider_babelqueue.sensors import BabelQueueDeadLetterSensor, BabelQueueQueueDepthSensor
from tests.airflow_harness import run_dag, task_states, xcom
from tests.connections import ALL, BROWSABLE, define

ERRORS: list[BaseException] = []


def later(conn_id: str, queue: str, delay: float, started: threading.Event) -> threading.Thread:
    """Once the first sensor runs, wait ``delay`` s and publish two messages; ``delay`` s later publish a third
    and dead-letter the oldest as unknown_urn (the backlog stays at two).

    The hook and binding are made here, in the test's thread, before the DAG runs. Under ``dag.test()`` the
    task runs in this process, and while it runs Airflow's connection lookup goes through the in-process
    supervisor channel, whose ``send`` deletes the module-global ``SUPERVISOR_COMMS`` until it answers. A
    lookup from this thread during the run raced the task's own calls: the task then failed with
    ``NameError: name 'SUPERVISOR_COMMS' is not defined`` while reporting its deferral (seen in CI)."""
    hook = get_hook(conn_id)
    binding = hook.get_binding()

    def act() -> None:
        try:
            work()
        except BaseException as exc:  # surfaced by the test: a silent producer would look like a sensor bug
            ERRORS.append(exc)
            raise

    def work() -> None:
        try:
            assert started.wait(timeout=60), "the first sensor never started"
            time.sleep(delay)
            for i in range(3):
                if i == 2:
                    time.sleep(delay)
                body = bq.encode(bq.make_envelope("urn:babel:orders:created", {"i": i}, queue_name=queue))
                binding.publish(body, queue)
            message = binding.reserve(queue, timeout=2)
            binding.dead_letter(message, "unknown_urn")
        finally:
            hook.close()

    thread = threading.Thread(target=act, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("mode", ["poke", "reschedule", "deferrable"])
@pytest.mark.parametrize("conn_id", ALL)
def test_sensors_wait_for_depth_and_dead_letters(conn_id: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    define(monkeypatch, conn_id)
    browsable = conn_id in BROWSABLE
    queue = f"sense-{uuid.uuid4().hex[:8]}"
    started = threading.Event()  # set when the first sensor starts: it must then wait for the arrivals
    common = {
        "babelqueue_conn_id": conn_id,
        "queue_name": queue,
        "poke_interval": 0.5,
        "timeout": 60,
        "mode": "reschedule" if mode == "reschedule" else "poke",
        "deferrable": mode == "deferrable",
    }
    with DAG(
        f"bq_sensors_{mode}_{uuid.uuid4().hex[:6]}", schedule=None, start_date=datetime.datetime(2026, 1, 1)
    ) as dag:
        depth = BabelQueueQueueDepthSensor(
            task_id="backlog", comparison=">=", threshold=2, on_execute_callback=lambda context: started.set(), **common
        )
        dead = BabelQueueDeadLetterSensor(
            task_id="dead_letters", reasons=["unknown_urn"] if browsable else None, **common
        )
        depth >> dead
    thread = later(conn_id, queue, 1.5, started)
    run = run_dag(dag)
    thread.join(timeout=30)
    assert not ERRORS, ERRORS
    assert task_states(run) == {"backlog": "success", "dead_letters": "success"}
    assert xcom(run, "backlog") == 2
    result = xcom(run, "dead_letters")
    assert (result["depth"], result["matching"]) == (1, 1)
    expected_sample = [("urn:babel:orders:created", "unknown_urn")] if browsable else []
    assert [(e["urn"], e["reason"]) for e in result["sample"]] == expected_sample


def test_depth_sensor_with_consecutive_observations() -> None:
    queue = f"sense-{uuid.uuid4().hex[:8]}"
    hook = get_hook()
    hook.get_binding().publish(bq.encode(bq.make_envelope("urn:x", {})), queue)
    hook.close()
    sensor = BabelQueueQueueDepthSensor(
        task_id="s", queue_name=queue, threshold=1, consecutive=3, observation_interval=0.1, deferrable=False
    )
    value = sensor.poke({})
    assert (value.is_done, value.xcom_value) == (True, 1)
    sensor._close()


def test_rendered_threshold_and_baseline() -> None:
    """A template renders text: a number's text counts, the ``None`` an unset param renders means the default,
    and anything else fails naming the parameter."""
    queue = f"sense-{uuid.uuid4().hex[:8]}"
    hook = get_hook()
    binding = hook.get_binding()
    binding.publish(bq.encode(bq.make_envelope("urn:x", {})), queue)
    binding.dead_letter(binding.reserve(queue, timeout=1), "unknown_urn")
    binding.publish(bq.encode(bq.make_envelope("urn:x", {})), queue)
    hook.close()

    def poke(threshold: str) -> tuple[bool, int]:
        sensor = BabelQueueQueueDepthSensor(task_id="s", queue_name=queue, threshold=threshold, deferrable=False)  # type: ignore[arg-type]
        try:
            value = sensor.poke({})
        finally:
            sensor._close()
        return value.is_done, value.xcom_value

    assert poke("1") == (True, 1) and poke(" 2 ") == (False, 1) and poke("None") == (True, 1)
    with pytest.raises(ValueError, match="threshold must be a whole number, got 'many'"):
        poke("many")
    with pytest.raises(ValueError, match="threshold must not be negative, got '-1'"):
        poke("-1")
    for baseline, done in (("None", True), ("1", False), ("0", True)):
        sensor = BabelQueueDeadLetterSensor(task_id="d", queue_name=queue, baseline=baseline, deferrable=False)  # type: ignore[arg-type]
        try:
            assert sensor.poke({}).is_done is done, baseline
        finally:
            sensor._close()
    rescheduled = BabelQueueDeadLetterSensor(task_id="r", queue_name=queue, new_only=True, mode="reschedule",
                                             baseline="{{ params.baseline }}", deferrable=False)
    rescheduled.baseline = "None"  # as rendered for an unset param
    try:
        with pytest.raises(ValueError, match="baseline rendered to 'None'; new_only in reschedule mode needs"):
            rescheduled.poke({})
    finally:
        rescheduled._close()


def test_new_only_in_reschedule_mode_needs_a_baseline() -> None:
    with pytest.raises(ValueError, match="new_only needs a baseline"):
        BabelQueueDeadLetterSensor(task_id="s", queue_name="q", new_only=True, mode="reschedule", deferrable=False)
    BabelQueueDeadLetterSensor(task_id="s", queue_name="q", new_only=True, baseline=3, mode="reschedule")


def test_deferrable_defaults_to_the_airflow_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    assert BabelQueueQueueDepthSensor(task_id="s", queue_name="q").deferrable is True
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "False")
    assert BabelQueueQueueDepthSensor(task_id="s", queue_name="q").deferrable is False
