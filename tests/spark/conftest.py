"""One real ``spark-submit`` run of triage → report → replay_set on the known dead letters, shared by the tests.

spark-submit starts a JVM (~15-25 s each on this machine), so the three jobs run once per session and every
test reads their outputs. Tests that need the run are skipped when ``spark-submit`` or Java is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_babelqueue.spark import job_path, recommended_conf
from airflow_provider_babelqueue.spark.class_archive import CLASS_ARCHIVE_ENV, with_archive
from tests.spark.dead_letters import write_drain_files

VENV_BIN = str(Path(sys.executable).parent)
# what the operator submits on a local connection (so the known answers hold under the recommended settings),
# with fewer shuffle partitions for 19 records
BASE_CONF = {"spark.sql.shuffle.partitions": "4"}
SPARK_CONF = recommended_conf("local[2]", BASE_CONF)


def spark_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env


def spark_submit_path() -> str | None:
    return shutil.which("spark-submit", path=spark_env()["PATH"])


def submit(job: str, *args: str, log: list[str] | None = None, conf: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one job with the real spark-submit in local[2] (with the session's class archive, as the operator
    would pass it); returns its JSON summary line, and appends its stderr (the task log's part) to ``log``.
    ``conf`` adds Spark settings (e.g. ``spark.driver.memory``) to the recommended ones."""
    command = [spark_submit_path() or "spark-submit", "--master", "local[2]"]
    settings = with_archive(recommended_conf("local[2]", {**BASE_CONF, **(conf or {})}),
                            os.environ.get(CLASS_ARCHIVE_ENV))
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    done = subprocess.run([*command, job_path(job), *args], env=spark_env(), capture_output=True, text=True,
                          timeout=300, check=False)
    if done.returncode != 0:
        pytest.fail(f"spark-submit {job} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    if log is not None:
        log.append(done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith('{"job":')]
    assert len(lines) == 1, done.stdout
    return json.loads(lines[0])


@dataclass(frozen=True)
class SparkRun:
    drain_dir: Path
    triage_dir: Path
    report_dir: Path
    combined_report_dir: Path
    replay_dir: Path
    triage: dict[str, Any]
    report: dict[str, Any]
    replay: dict[str, Any]


@pytest.fixture(scope="session")
def spark_archive(spark_class_archive: Path | None) -> Path:
    """The session's class archive, for tests that run ``spark-submit``: they skip when it could not be built
    because Spark or Java is missing."""
    if spark_class_archive is None:
        pytest.skip("spark-submit (pyspark) or java is not installed")
    return spark_class_archive


@pytest.fixture(scope="session")
def spark_run(tmp_path_factory: pytest.TempPathFactory, spark_archive: Path) -> SparkRun:
    root = tmp_path_factory.mktemp("spark-run")
    drain_dir, triage_dir = root / "drained", root / "triage"
    report_dir, replay_dir, combined = root / "report", root / "replay", root / "report-combined"
    write_drain_files(drain_dir)
    # a folder and a glob: both forms of --input
    triage = submit("triage", "--input", str(drain_dir / "dlq-run1-*.jsonl"), str(drain_dir / "dlq-run2-*.jsonl"),
                    "--output", str(triage_dir), "--report-output", str(combined))
    report = submit("report", "--input", str(triage_dir), "--output", str(report_dir))
    replay = submit("replay_set", "--input", str(triage_dir), "--output", str(replay_dir))
    return SparkRun(drain_dir, triage_dir, report_dir, combined, replay_dir, triage, report, replay)
