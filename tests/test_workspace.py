"""The run workspace helpers the sample DAGs and the demo share, and the replay operator's source check."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_babelqueue.operators.replay import BabelQueueReplayOperator
from airflow_provider_babelqueue.workspace import run_workspace, summary_table


def test_run_workspace_makes_run_ids_path_safe(tmp_path: Path) -> None:
    folders = run_workspace(str(tmp_path), "babelqueue_dlq_triage_report", "manual__2026-11-21T08:30:11.589+00:00")
    base = f"{tmp_path}/babelqueue_dlq_triage_report/manual__2026-11-21T08_30_11.589_00_00"
    assert folders == {"root": base, "drain": f"{base}/drain", "triage": f"{base}/triage",
                       "report": f"{base}/report", "replay_set": f"{base}/replay_set"}


def test_run_workspace_defaults_and_urls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    assert run_workspace("", "d", "r")["root"] == f"{tmp_path}/babelqueue/runs/d/r"
    assert run_workspace("s3://bucket/dlq/", "d", "r")["drain"] == "s3://bucket/dlq/d/r/drain"
    monkeypatch.chdir(tmp_path)
    assert run_workspace("relative", "d", "r")["root"] == f"{tmp_path}/relative/d/r"  # spark may run elsewhere
    assert run_workspace(f"file://{tmp_path}/x", "d", "r")["root"] == f"{tmp_path}/x/d/r"


def test_summary_table_exact_text() -> None:
    assert summary_table({"failed": 10, "poison": 2}, ("reason", "n"), total=True) == (
        "reason   n\n"
        "------  --\n"
        "failed  10\n"
        "poison   2\n"
        "total   12"
    )


def test_replay_source_is_checked_after_rendering() -> None:
    # Both templated: only known after rendering, so construction passes.
    BabelQueueReplayOperator(task_id="a", queue_name="{{ params.q }}", replay_set="{{ params.s }}")
    # A blank value counts as not given.
    BabelQueueReplayOperator(task_id="b", queue_name="", replay_set="/data/set")
    with pytest.raises(ValueError, match="either queue_name .* or replay_set"):
        BabelQueueReplayOperator(task_id="c", queue_name="orders", replay_set="/data/set")
    with pytest.raises(ValueError, match="either queue_name .* or replay_set"):
        BabelQueueReplayOperator(task_id="d", queue_name=" ", replay_set=None)
    with pytest.raises(ValueError, match="max_messages_per_second must be positive"):
        BabelQueueReplayOperator(task_id="e", queue_name="orders", max_messages_per_second=0)
    BabelQueueReplayOperator(task_id="f", queue_name="orders", max_messages_per_second="{{ params.rate }}")
