"""Per-message log lines are capped (``message_log_lines``): a consume task whose every message fails writes the
first lines of each kind and a count of the rest, in a real DAG under dag.test() on the embedded SQLite queue; a
corrupt replay set's warnings the same way; the window arithmetic on a fake clock."""

from __future__ import annotations

import datetime
import logging
import re
import uuid
from pathlib import Path

import pytest
from airflow.sdk import DAG

from airflow_provider_babelqueue.engine.logs import LineBudget
from airflow_provider_babelqueue.hooks import get_hook
from airflow_provider_babelqueue.operators.consume import BabelQueueConsumeOperator
from airflow_provider_babelqueue.operators.publish import BabelQueuePublishOperator
from tests.airflow_harness import run_dag, task_states, xcom

URN = "urn:babel:orders:created"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_window_allows_its_lines_per_kind_then_counts_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    log, clock = logging.getLogger("tests.line_budget"), Clock()
    budget = LineBudget(log, 3, clock=clock)
    with caplog.at_level(logging.INFO, logger="tests.line_budget"):
        assert [budget.allow("retry") for _ in range(10)] == [True] * 3 + [False] * 7
        assert [budget.allow("dead-letter") for _ in range(4)] == [True] * 3 + [False]  # its own count
        assert not caplog.messages  # nothing is said until the window ends
        clock.now += 59.9
        assert budget.allow("retry") is False
        clock.now += 0.1  # the window is over: its counts are said, a new one begins
        assert budget.allow("retry") is True
        assert caplog.messages == [
            "1 more dead-letter lines were not logged (at most 3 a minute: message_log_lines); the summary counts "
            "every message",
            "8 more retry lines were not logged (at most 3 a minute: message_log_lines); the summary counts every "
            "message"]
        caplog.clear()
        budget.flush()  # nothing was held back in this window
        assert not caplog.messages
    unlimited = LineBudget(log, None, clock=clock)
    assert all(unlimited.allow("retry") for _ in range(10_000))
    silent = LineBudget(log, 0, clock=clock)
    assert not silent.allow("retry")


@pytest.mark.parametrize("value", [-1, 1.5, True, "100"])
def test_message_log_lines_is_checked_when_the_dag_is_parsed(value: object) -> None:
    with pytest.raises(ValueError, match="message_log_lines must be a whole number >= 0 or None"):
        BabelQueueConsumeOperator(task_id="c", queue_name="q", handlers={}, message_log_lines=value)  # type: ignore[arg-type]


def test_a_consume_task_whose_every_message_fails_logs_the_first_lines_and_a_count(
        capfd: pytest.CaptureFixture[str]) -> None:
    queue, n, cap = f"orders-{uuid.uuid4().hex[:8]}", 250, 40
    with DAG(f"bq_consume_log_lines_{uuid.uuid4().hex[:6]}", schedule=None,
             start_date=datetime.datetime(2026, 1, 1)) as dag:
        publish = BabelQueuePublishOperator(task_id="publish", queue_name=queue, urn=URN,
                                            data=[{"order_id": i} for i in range(n)])
        consume = BabelQueueConsumeOperator(task_id="consume", queue_name=queue,
                                            handlers={URN: "tests.operators.handlers.always_fail"},
                                            max_attempts=1, reserve_timeout=0.2, message_log_lines=cap)
        publish >> consume
    capfd.readouterr()
    run = run_dag(dag)
    out = capfd.readouterr().out
    assert task_states(run) == {"publish": "success", "consume": "success"}
    assert xcom(run, "consume")["dead_lettered"] == {"failed": n}  # the summary counts every message
    lines = [line for line in out.splitlines() if re.search(r"dead-lettered [0-9a-f-]{36} \(failed\)", line)]
    assert len(lines) == cap, out[-3000:]
    counted = re.findall(r"(\d+) more dead-letter lines were not logged \(at most (\d+) a minute", out)
    assert counted == [(str(n - cap), str(cap))], out[-3000:]
    hook = get_hook()
    try:
        assert hook.get_binding().dead_letter_depth(queue) == n
    finally:
        hook.close()


def test_a_corrupt_replay_set_logs_its_first_unusable_lines_and_a_count(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The replay engine's reader of a replay set caps its per-line warnings the same way."""
    from airflow_provider_babelqueue.engine.replay.feeds import iter_replay_set

    path = tmp_path / "torn.jsonl"
    path.write_bytes(b"".join(b'{"torn": %d\n' % i for i in range(150)))  # cut mid-record
    log = logging.getLogger("tests.replay_set_lines")
    with caplog.at_level(logging.INFO, logger="tests.replay_set_lines"):
        items = list(iter_replay_set(str(path), log))
    assert items == ["unreadable_line"] * 150  # every line is still counted by the replay
    warnings = [m for m in caplog.messages if "is unusable and is skipped" in m]
    assert len(warnings) == 100 and warnings[0].startswith(f"replay set {path} line 1 is unusable")
    assert [m for m in caplog.messages if "were not logged" in m] == [
        "50 more unusable replay-set lines were not logged (at most 100 a minute: message_log_lines); the summary "
        "counts every message"]
