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


def test_recommended_conf_adds_local_settings_only_for_local_masters_and_the_callers_win() -> None:
    from airflow_provider_babelqueue.spark import JOB_CONF, LOCAL_CONF, recommended_conf

    assert recommended_conf("yarn") == JOB_CONF and recommended_conf(None) == JOB_CONF
    assert recommended_conf("local-cluster[2,1,1024]") == JOB_CONF
    assert recommended_conf("local[2]") == {**JOB_CONF, **LOCAL_CONF} == recommended_conf("local")
    mine = recommended_conf("local[*]", {"spark.driver.memory": "2g", "spark.extra": "x"})
    assert mine["spark.driver.memory"] == "2g" and mine["spark.extra"] == "x"
    assert mine["spark.ui.enabled"] == LOCAL_CONF["spark.ui.enabled"]
