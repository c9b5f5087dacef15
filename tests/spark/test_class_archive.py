"""The driver's class-data archive: built by a real training run, then used by a real JVM."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest

from airflow_provider_babelqueue.spark import JOB_CONF, LOCAL_CONF, recommended_conf
from airflow_provider_babelqueue.spark.class_archive import archive_option, sample_records
from tests.spark.conftest import spark_env, spark_submit_path

JAVA = "spark.driver.extraJavaOptions"


def test_recommended_conf_adds_an_existing_archive_to_local_driver_options_only(tmp_path: Path) -> None:
    archive = tmp_path / "driver.jsa"
    missing = recommended_conf("local[2]", class_archive=str(archive))
    assert missing == {**JOB_CONF, **LOCAL_CONF}  # no file: nothing added
    archive.write_bytes(b"x")
    option = f"-XX:SharedArchiveFile={archive}"
    assert recommended_conf("local[2]", class_archive=str(archive))[JAVA] == f"{LOCAL_CONF[JAVA]} {option}"
    mine = recommended_conf("local[*]", {JAVA: "-Xss4m"}, class_archive=str(archive))
    assert mine[JAVA] == f"-Xss4m {option}"  # the caller's options stay; the archive joins them
    assert JAVA not in recommended_conf("yarn", class_archive=str(archive))  # a cluster's driver is elsewhere
    assert archive_option(None) is None and archive_option(tmp_path / "nope.jsa") is None


def test_the_training_sample_covers_every_branch_the_jobs_take() -> None:
    records = [orjson.loads(line) for line in sample_records(8).splitlines()]
    assert len(records) == 8 and {r["body_encoding"] for r in records} == {"utf-8", "base64"}
    reasons = {orjson.loads(r["body"])["dead_letter"]["reason"] for r in records if r["body"].startswith('{"')
               and '"dead_letter"' in r["body"]}
    assert reasons == {"failed", "unknown_urn"}


@pytest.mark.slow
def test_a_built_archive_is_mapped_by_the_next_driver_jvm(tmp_path: Path, spark_archive: Path) -> None:
    # the session's archive (tests/conftest.py): build_class_archive's real training run, shared by every submit
    archive, submit = spark_archive, spark_submit_path()
    assert archive.is_file() and archive.stat().st_size > 10_000_000
    assert [p.name for p in archive.parent.iterdir()] == ["driver.jsa"]  # no partial file left behind
    probe = tmp_path / "probe.py"
    probe.write_text("from pyspark.sql import SparkSession\n"
                     "s = SparkSession.builder.getOrCreate()\nprint(s.range(3).count())\ns.stop()\n")
    conf = recommended_conf("local[1]", class_archive=str(archive))
    command = [submit, "--master", "local[1]"]
    for key, value in {**conf, JAVA: f"{conf[JAVA]} -Xlog:class+load=info:file={tmp_path}/classes.log"}.items():
        command += ["--conf", f"{key}={value}"]
    done = subprocess.run([*command, str(probe)], env=spark_env(), capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = (tmp_path / "classes.log").read_text()
    shared = [line for line in loaded.splitlines()
              if "org.apache.spark." in line and "shared objects file (top)" in line]
    assert len(shared) > 1000, loaded[-2000:]  # Spark's own classes come from the archive's top (dynamic) layer
