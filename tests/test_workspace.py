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
                       "report": f"{base}/report", "replay_set": f"{base}/replay_set",
                       "pending": f"{tmp_path}/babelqueue_dlq_triage_report/_pending"}


@pytest.mark.parametrize(("root", "executors", "warned"), [
    ("/data/runs", "LocalExecutor", None),
    ("/data/runs", "airflow.executors.local_executor.LocalExecutor", None),
    ("/data/runs", "CeleryExecutor", "CeleryExecutor"),
    ("/data/runs", "LocalExecutor,my_k8s:airflow.providers.cncf.kubernetes.executors.KubernetesExecutor",
     "KubernetesExecutor"),
    ("s3://bucket/runs", "CeleryExecutor", None),
    ("file:///data/runs", "CeleryExecutor", "CeleryExecutor"),
])
def test_a_local_output_root_with_remote_workers_is_warned_about(root: str, executors: str,
                                                                 warned: str | None) -> None:
    from airflow_provider_babelqueue.workspace import shared_storage_warning

    warning = shared_storage_warning(root, executors)
    if warned is None:
        assert warning is None
    else:
        assert warning is not None and f"but the {warned} may run" in warning and "object-storage URL" in warning


def test_run_workspace_defaults_and_urls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    assert run_workspace("", "d", "r")["root"] == f"{tmp_path}/babelqueue/runs/d/r"
    assert run_workspace("s3://bucket/dlq/", "d", "r")["drain"] == "s3://bucket/dlq/d/r/drain"
    monkeypatch.chdir(tmp_path)
    assert run_workspace("relative", "d", "r")["root"] == f"{tmp_path}/relative/d/r"  # spark may run elsewhere
    assert run_workspace(f"file://{tmp_path}/x", "d", "r")["root"] == f"{tmp_path}/x/d/r"


def test_run_workspace_takes_null_as_the_default_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The triage DAGs' ``output_root`` param defaults to null (the UI's trigger form refuses a blank required
    string), and the form sends null for a field left blank: both mean the default root, as ``""`` does."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    expected = f"{tmp_path}/babelqueue/runs/babelqueue_dlq_triage_report/scheduled__2026-01-02T00_00_00_00_00"
    for blank in (None, "", "  "):
        folders = run_workspace(blank, "babelqueue_dlq_triage_report", "scheduled__2026-01-02T00:00:00+00:00")
        assert folders["root"] == expected, f"output_root={blank!r} gave {folders['root']}"
        assert folders["drain"] == f"{expected}/drain"


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


def test_the_configured_output_root_is_the_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``[babelqueue] output_root`` names where runs write when a run gives none; blank keeps AIRFLOW_HOME's."""
    from airflow_provider_babelqueue.workspace import default_output_root, run_workspace

    monkeypatch.setenv("AIRFLOW__BABELQUEUE__OUTPUT_ROOT", "s3://aws_default@dlq/runs")
    assert default_output_root() == "s3://aws_default@dlq/runs"
    assert run_workspace("", "triage", "manual__1")["drain"] == "s3://aws_default@dlq/runs/triage/manual__1/drain"
    assert run_workspace(str(tmp_path), "triage", "r")["root"] == f"{tmp_path}/triage/r"
    monkeypatch.setenv("AIRFLOW__BABELQUEUE__OUTPUT_ROOT", "")
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    assert default_output_root() == str(tmp_path / "babelqueue" / "runs")
