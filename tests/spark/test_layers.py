"""The Spark jobs stay Airflow-free and plain: they run under spark-submit on clusters that have no Airflow, and
import neither the bindings, the engine nor the optional class archive."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def test_jobs_import_no_airflow() -> None:
    code = ("import sys\n"
            "import airflow_provider_babelqueue.spark.triage, airflow_provider_babelqueue.spark.report\n"
            "import airflow_provider_babelqueue.spark.replay_set\n"
            "bad = sorted(m for m in sys.modules if m == 'airflow' or m.startswith(('airflow.',"
            " 'airflow_provider_babelqueue.bindings', 'airflow_provider_babelqueue.hooks',"
            " 'airflow_provider_babelqueue.operators', 'airflow_provider_babelqueue.engine',"
            " 'airflow_provider_babelqueue.drain', 'airflow_provider_babelqueue.spark.class_archive')))\n"
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
    # the recommended initial heap follows the caller's memory; the rest of the options stay
    java = "spark.driver.extraJavaOptions"
    assert LOCAL_CONF[java].startswith("-Xms1g ") and LOCAL_CONF["spark.driver.memory"] == "1g"
    assert mine[java] == LOCAL_CONF[java].replace("-Xms1g ", "-Xms2g ")
    # a caller's own options replace ours whole: no -Xms is added to them
    assert recommended_conf("local[2]", {"spark.driver.memory": "2g", java: "-Xss4m"})[java] == "-Xss4m"


PROBE = """\
import sys, threading
from pyspark import SparkContext
from airflow_provider_babelqueue.spark.common import get_spark, stop_spark
s = get_spark("probe")
heap = s._jvm.java.lang.management.ManagementFactory.getMemoryMXBean().getHeapMemoryUsage()
s.range(5).write.parquet(sys.argv[1])
server = s.sparkContext._accumulatorServer
stop_spark(s)
stopping = [t for t in threading.enumerate() if t.name == "babelqueue-accumulator-stop"]
for thread in stopping:
    thread.join(10)
print("probe", heap.getInit(), SparkContext._active_spark_context is None, len(stopping),
      server.server_shutdown, server.socket.fileno())
"""


@pytest.mark.slow
def test_the_jobs_local_session_sizes_its_heap_writes_no_checksums_and_stops_whole(tmp_path: Path) -> None:
    # a real driver JVM with the recommended local settings and a smaller memory than LOCAL_CONF's: a -Xms left
    # at 1g would stop it from starting (-Xms above the launcher's -Xmx512m)
    from airflow_provider_babelqueue.spark import recommended_conf
    from tests.spark.conftest import spark_env, spark_submit_path

    submit = spark_submit_path()
    if submit is None:
        pytest.skip("spark-submit (pyspark) is not installed")
    probe, out = tmp_path / "probe.py", tmp_path / "out"
    probe.write_text(PROBE)  # the jobs' own session helpers, so the probe sees what a job sees
    command = [submit, "--master", "local[1]"]
    for key, value in recommended_conf("local[1]", {"spark.driver.memory": "512m"}).items():
        command += ["--conf", f"{key}={value}"]
    done = subprocess.run([*command, str(probe), str(out)], env=spark_env(), capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("probe "))
    # the heap started at the caller's 512 MiB; stop_spark stopped the context, and the accumulator server on
    # its own thread: shut down, its socket closed (file number -1)
    assert line.split()[1:] == [str(512 * 2**20), "True", "1", "True", "-1"]
    written = sorted(path.name for path in out.iterdir())
    assert "_SUCCESS" in written and any(name.endswith(".parquet") for name in written)
    assert not [name for name in written if name.endswith(".crc")], written
