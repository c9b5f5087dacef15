"""``make demo``'s main job (``python -m tools.demo``) in a throwaway Airflow home.

It runs the triage DAG with ``airflow dags test`` in a subprocess, exactly as ``.ci/demo.sh`` does, then runs the
seed again to show a re-run starts from an empty queue. The README's first section must show the summary the demo
prints (the test compares the table lines).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools import demo

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _table_lines(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("dead-letter reason"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("total"))
    return lines[start:end + 1]


@pytest.mark.usefixtures("spark_class_archive")  # the worker's archive, as an operator finds it in its environment
def test_demo_runs_the_triage_dag_and_reruns_from_scratch(tmp_path: Path) -> None:
    home = tmp_path / "airflow"
    home.mkdir()
    shutil.copy(Path(os.environ["AIRFLOW_HOME"]) / "airflow.db", home / "airflow.db")  # migrated by make test
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "PYSPARK_PYTHON": sys.executable,
    }
    runs = tmp_path / "runs"
    command = [sys.executable, "-m", "tools.demo", "--output-root", str(runs)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout

    [run] = [path for path in (runs / demo.DAG_ID).iterdir() if path.name != "_pending"]
    # the triage succeeded: the drain file left the pending folder for the run's own drain folder
    assert list((runs / demo.DAG_ID / "_pending").iterdir()) == [] and len(list((run / "drain").glob("*.jsonl"))) == 1
    assert f"HTML report              {run / 'report' / 'report.html'}" in out
    assert (run / "report" / "report.html").is_file()
    # the replay set: one folder of drain records (no folder per queue), the 10 failures' stored bodies
    replay_lines = [json.loads(line) for part in sorted((run / "replay_set").glob("part-*"))
                    for line in part.read_bytes().splitlines()]
    assert len(replay_lines) == 10 and {record["queue_name"] for record in replay_lines} == {"orders"}
    assert not [path for path in (run / "replay_set").iterdir() if path.is_dir()]
    assert sorted(p.name for p in (run / "triage").glob("reason=*")) == sorted(
        f"reason={reason}" for reason in demo.expected_reasons())
    table = _table_lines(out)
    assert table[2:] == [f"{r:<26}  {n:>8}" for r, n in demo.expected_reasons().items()] + [f"{'total':<26}  {15:>8}"]
    assert "replay set (reasons ['failed']): 10 message(s) → orders: 10; not republished" in out
    readme = (ROOT / "README.md").read_text()
    assert "\n".join(table) in readme, "README's first section must show the demo's summary table"

    # The printed replay command works as printed (its own environment included): the 10 failures go back to
    # their original queue, with no target named.
    replay_command = out.split("to replay them:\n", 1)[1].splitlines()[0].strip()
    assert f'"replay_set": "{run / "replay_set"}"' in replay_command and "target_queue_name" not in replay_command
    replayed = subprocess.run(replay_command, shell=True, env={**env, "AIRFLOW_HOME": "/nonexistent"},  # noqa: S602
                              capture_output=True, text=True, timeout=300, check=False)
    assert replayed.returncode == 0, replayed.stdout[-3000:] + replayed.stderr[-3000:]
    from airflow_provider_babelqueue.bindings.sql import SqlBinding, SqlConfig, sqlite_url

    queue = SqlBinding(SqlConfig(url=sqlite_url(home / "babelqueue.sqlite")))
    assert queue.depth("orders") == 10
    queue.close()

    again = subprocess.run([*command, "--skip-dag"], env=env, capture_output=True, text=True, timeout=300,
                           check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "dead letters waiting in 'jobs_failed': 15" in again.stdout  # not 30: the queue was emptied first
    assert not (runs / demo.DAG_ID).exists()  # the previous run's outputs were cleared
