"""The Spark jobs stay Airflow-free: they run under spark-submit on clusters that have no Airflow."""

from __future__ import annotations

import subprocess
import sys


def test_jobs_import_no_airflow() -> None:
    code = ("import sys\n"
            "import airflow_provider_babelqueue.spark.triage, airflow_provider_babelqueue.spark.report\n"
            "import airflow_provider_babelqueue.spark.replay_set\n"
            "bad = sorted(m for m in sys.modules if m == 'airflow' or m.startswith(('airflow.',"
            " 'airflow_provider_babelqueue.bindings', 'airflow_provider_babelqueue.hooks',"
            " 'airflow_provider_babelqueue.operators')))\n"
            "assert not bad, bad\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def test_spark_package_import_does_not_need_pyspark() -> None:
    code = ("import sys\nfrom airflow_provider_babelqueue.spark import job_path\n"
            "assert job_path('triage').endswith('triage.py') and 'pyspark' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
