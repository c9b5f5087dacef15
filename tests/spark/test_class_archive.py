"""The optional driver class-data archive: its settings, its layer, and a real build mapped by the next JVM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from airflow_provider_babelqueue.spark import recommended_conf
from airflow_provider_babelqueue.spark.class_archive import archive_option, sample_records, with_archive
from tests.spark.conftest import spark_env, spark_submit_path

JAVA = "spark.driver.extraJavaOptions"


def test_an_existing_archive_joins_the_driver_options_and_a_missing_one_changes_nothing(tmp_path: Path) -> None:
    archive = tmp_path / "driver.jsa"
    local = recommended_conf("local[2]")
    assert with_archive(local, archive) == local and with_archive(local, None) == local  # no file: nothing added
    assert archive_option(None) is None and archive_option(archive) is None
    archive.write_bytes(b"x")
    option = f"-XX:SharedArchiveFile={archive}"
    assert archive_option(archive) == option
    joined = with_archive(local, archive)
    assert joined == {**local, JAVA: " ".join(filter(None, (local.get(JAVA), option)))}
    assert with_archive({JAVA: "-Xss4m"}, archive)[JAVA] == f"-Xss4m {option}"  # the caller's options stay
    assert with_archive({}, str(archive)) == {JAVA: option}


def test_the_archive_module_imports_only_the_core_and_the_standard_library() -> None:
    # an optional aid: building it needs no binding, no drain engine, no Airflow and not even pyspark
    code = ("import sys\nfrom airflow_provider_babelqueue.spark.class_archive import sample_records\n"
            "sample_records(4)\n"
            "ours = sorted(m for m in sys.modules if m.startswith('airflow_provider_babelqueue.'))\n"
            "bad = [m for m in ours if not m.startswith(('airflow_provider_babelqueue.core',"
            " 'airflow_provider_babelqueue.spark'))]\n"
            "bad += [m for m in sys.modules if m == 'airflow' or m.startswith(('airflow.', 'pyspark'))]\n"
            "assert not bad, bad\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def test_the_training_sample_covers_every_branch_the_jobs_take() -> None:
    records = [orjson.loads(line) for line in sample_records(8).splitlines()]
    assert len(records) == 8 and {r["body_encoding"] for r in records} == {"utf-8", "base64"}
    reasons = {orjson.loads(r["body"])["dead_letter"]["reason"] for r in records if r["body"].startswith('{"')
               and '"dead_letter"' in r["body"]}
    assert reasons == {"failed", "unknown_urn"}
    assert {r["meta_id"] for r in records if '"dead_letter"' in r["body"]} != {""}  # ids, for deduplication


@pytest.mark.slow
def test_a_built_archive_is_mapped_by_the_next_driver_jvm(tmp_path: Path, spark_archive: Path) -> None:
    # the session's archive (tests/conftest.py): build_class_archive's real training run, shared by every submit
    archive, submit = spark_archive, spark_submit_path()
    assert archive.is_file() and archive.stat().st_size > 10_000_000
    assert sorted(p.name for p in archive.parent.iterdir()) == ["driver.jsa"]  # no partial file left behind
    probe = tmp_path / "probe.py"
    probe.write_text("from pyspark.sql import SparkSession\n"
                     "s = SparkSession.builder.getOrCreate()\nprint(s.range(3).count())\ns.stop()\n")
    conf = with_archive(recommended_conf("local[1]"), archive)
    command = [submit or "spark-submit", "--master", "local[1]"]
    for key, value in {**conf, JAVA: f"{conf[JAVA]} -Xlog:class+load=info:file={tmp_path}/classes.log"}.items():
        command += ["--conf", f"{key}={value}"]
    done = subprocess.run([*command, str(probe)], env=spark_env(), capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = (tmp_path / "classes.log").read_text()
    shared = [line for line in loaded.splitlines()
              if "org.apache.spark." in line and "shared objects file (top)" in line]
    assert len(shared) > 1000, loaded[-2000:]  # Spark's own classes come from the archive's top (dynamic) layer
