"""The driver's class-data archive: built by a real training run, then used by a real JVM."""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import orjson
import pytest

from airflow_provider_babelqueue.spark import JOB_CONF, LOCAL_CONF, recommended_conf
from airflow_provider_babelqueue.spark.class_archive import (
    archive_conf,
    archive_jars,
    archive_option,
    archive_python,
    sample_records,
    unsigned_copy,
)
from tests.spark.conftest import fake_archive, spark_env, spark_submit_path

JAVA = "spark.driver.extraJavaOptions"
CLASSPATH = "spark.driver.extraClassPath"


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
    assert CLASSPATH not in mine  # no unsigned jars next to this archive: the class path is left alone


def test_the_unsigned_jars_of_an_archive_go_first_on_the_driver_class_path(tmp_path: Path) -> None:
    archive = fake_archive(tmp_path, jars=("janino-3.1.9.jar", "commons-compiler-3.1.9.jar", "notes.txt"))
    folder = tmp_path / "driver.jsa.jars"
    jars = [str(folder / "commons-compiler-3.1.9.jar"), str(folder / "janino-3.1.9.jar")]  # name order, jars only
    assert archive_jars(archive) == jars
    assert archive_conf(archive) == {JAVA: f"-XX:SharedArchiveFile={archive}", CLASSPATH: os.pathsep.join(jars)}
    assert recommended_conf("local[2]", class_archive=str(archive))[CLASSPATH] == os.pathsep.join(jars)
    mine = recommended_conf("local[2]", {CLASSPATH: "/opt/extra.jar"}, class_archive=str(archive))
    assert mine[CLASSPATH] == os.pathsep.join([*jars, "/opt/extra.jar"])  # the archive's first, as in training
    assert CLASSPATH not in recommended_conf("yarn", class_archive=str(archive))
    assert archive_conf(tmp_path / "nope.jsa") == {}


def _jar(path: Path, entries: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as jar:
        for name, data in entries.items():
            jar.writestr(zipfile.ZipInfo(name, (2022, 11, 16, 10, 17, 0)), data, compress_type=zipfile.ZIP_DEFLATED)
    os.utime(path, ns=(1_668_590_263_000_000_000, 1_668_590_263_000_000_000))
    return path


def test_an_unsigned_copy_keeps_every_entry_but_the_signature_and_the_jars_time(tmp_path: Path) -> None:
    entries = {"META-INF/MANIFEST.MF": b"Manifest-Version: 1.0\r\n\r\nName: a/B.class\r\nSHA-256-Digest: x\r\n",
               "META-INF/CODESIGN.SF": b"signature file", "META-INF/CODESIGN.RSA": b"block",
               "META-INF/SIG-OLD": b"old-style", "META-INF/maven/pom.xml": b"<project/>",
               "a/B.class": b"\xca\xfe\xba\xbe" + bytes(range(256)) * 8, "a/C.class": b"\xca\xfe"}
    signed = _jar(tmp_path / "signed.jar", entries)
    copy = tmp_path / "out" / "signed.jar"
    copy.parent.mkdir()
    assert unsigned_copy(signed, copy) is True
    with zipfile.ZipFile(copy) as jar:
        kept = {info.filename: (jar.read(info), info.date_time, info.compress_type) for info in jar.infolist()}
    assert list(kept) == ["META-INF/MANIFEST.MF", "META-INF/maven/pom.xml", "a/B.class", "a/C.class"]
    assert {name: data for name, (data, _, _) in kept.items()} == {name: entries[name] for name in kept}
    assert {(date, kind) for _, date, kind in kept.values()} == {((2022, 11, 16, 10, 17, 0), zipfile.ZIP_DEFLATED)}
    assert copy.stat().st_mtime_ns == signed.stat().st_mtime_ns  # the JVM checks it against the archive's record
    first = copy.stat()
    assert unsigned_copy(signed, copy) is True  # a second build: the same file, left in place (same inode)
    assert (copy.stat().st_ino, copy.stat().st_size) == (first.st_ino, first.st_size)
    assert [p.name for p in copy.parent.iterdir()] == ["signed.jar"]  # no temporary file left
    plain = _jar(tmp_path / "plain.jar", {"META-INF/MANIFEST.MF": b"Manifest-Version: 1.0\r\n", "a/B.class": b"x"})
    assert unsigned_copy(plain, tmp_path / "out" / "plain.jar") is False  # nothing to strip: no copy made
    assert not (tmp_path / "out" / "plain.jar").exists()


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
    # no partial file left behind; next to the archive, the unsigned copies of Spark's two signed jars and the
    # compiled copies of its two Python zips
    assert sorted(p.name for p in archive.parent.iterdir()) == ["driver.jsa", "driver.jsa.jars", "driver.jsa.python"]
    assert [Path(jar).name.rsplit("-", 1)[0] for jar in archive_jars(archive)] == ["commons-compiler", "janino"]
    copies = archive_python(archive)
    assert [Path(copy).name.split("-", 1)[0] for copy in copies] == ["py4j", "pyspark.compiled.zip"]
    probe = tmp_path / "probe.py"
    probe.write_text("from airflow_provider_babelqueue.spark.bytecode import drop_stale_copies\n"
                     "print('dropped', drop_stale_copies())\nimport pyspark, py4j\n"
                     "print('modules', pyspark.__file__, py4j.__file__)\nfrom pyspark.sql import SparkSession\n"
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
    # so do the query compiler's (from a signed jar the JVM would load and verify each of them again)
    janino = [line for line in loaded.splitlines() if "[class,load] org.codehaus.janino." in line]
    assert len(janino) > 100 and all("shared objects file (top)" in line for line in janino), janino[:5]
    # the driver checked the compiled copies against the installation's zips, kept them, and imported bytecode
    assert "dropped []" in done.stdout, done.stdout + done.stderr[-2000:]
    modules = next(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("modules "))
    assert modules == [os.path.join(copies[1], "pyspark", "__init__.pyc"),
                       os.path.join(copies[0], "py4j", "__init__.pyc")]
