"""The Spark connection check: a missing or unusable connection fails before any work, naming it and the fix.

Connections come from ``AIRFLOW_CONN_*`` variables, as a deployment defines them. The master URL is compared
with the one the Spark provider's own hook builds from the same connection, so the check and spark-submit never
disagree about where a job would go. The standalone case listens on (and then frees) a real loopback port.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_babelqueue.exceptions import ConnectionConfigError
from airflow_provider_babelqueue.operators.pending import carried_over, file_key, move_into, waiting_files
from airflow_provider_babelqueue.operators.spark_connection import check_spark_connection, spark_master, submit_path

VENV_BIN = str(Path(sys.executable).parent)


def define(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


@pytest.mark.parametrize("fields", [
    {"conn_type": "spark", "host": "local[*]"},
    {"conn_type": "spark", "host": "local[2]"},
    {"conn_type": "spark", "host": "spark://10.0.0.5", "port": 7077},
    {"conn_type": "spark", "host": "10.0.0.5", "port": 7077},
    {"conn_type": "spark", "host": "yarn"},
])
def test_the_master_is_the_one_the_spark_provider_builds(monkeypatch: pytest.MonkeyPatch, fields: dict) -> None:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    define(monkeypatch, "spark_same", **fields)
    expected = SparkSubmitHook(conn_id="spark_same")._resolve_connection()["master"]
    assert spark_master(fields["conn_type"], fields["host"], fields.get("port")) == expected


def test_a_kubernetes_master_is_the_host() -> None:
    # (the provider's hook needs the Kubernetes client to resolve a k8s:// connection, so it is spelled out here)
    assert spark_master("spark", "k8s://https://k8s.example:6443", None) == "k8s://https://k8s.example:6443"


def test_a_missing_connection_names_itself_and_how_to_define_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_NOWHERE", raising=False)
    with pytest.raises(ConnectionConfigError) as caught:
        check_spark_connection("spark_nowhere")
    message = str(caught.value)
    assert "'spark_nowhere' is not defined" in message and "YARN" in message
    assert "AIRFLOW_CONN_SPARK_NOWHERE='{\"conn_type\": \"spark\", \"host\": \"local[*]\"}'" in message
    for kind in ("spark://", "k8s://", "'yarn'"):
        assert kind in message


def test_a_local_master_needs_java_and_finds_the_venvs_spark_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    define(monkeypatch, "spark_here", conn_type="spark", host="local[*]")
    # a worker started by absolute path: neither the venv's bin nor java on PATH, no JAVA_HOME
    bare = {"PATH": "/nonexistent"}
    with pytest.raises(ConnectionConfigError, match="needs Java 17 or 21: no JAVA_HOME and no 'java' on PATH"):
        check_spark_connection("spark_here", bare)
    target = check_spark_connection("spark_here", {**os.environ, "PATH": os.environ.get("PATH", "")})
    assert target.master == "local[*]" and target.is_local
    assert target.binary == str(Path(VENV_BIN, "spark-submit")) or Path(target.binary).name == "spark-submit"
    assert VENV_BIN in submit_path({"PATH": "/nonexistent"}).split(os.pathsep)


def test_an_unknown_spark_binary_says_where_it_looked(monkeypatch: pytest.MonkeyPatch) -> None:
    define(monkeypatch, "spark_bin", conn_type="spark", host="local[*]", extra={"spark-binary": "spark3-submit"})
    with pytest.raises(ConnectionConfigError, match="'spark3-submit' .* was not found on this worker's PATH"):
        check_spark_connection("spark_bin")


def test_a_standalone_master_must_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        define(monkeypatch, "spark_cluster", conn_type="spark", host="spark://127.0.0.1", port=port)
        assert check_spark_connection("spark_cluster").master == f"spark://127.0.0.1:{port}"
    # the port is closed now
    with pytest.raises(ConnectionConfigError, match=rf"\(spark://127.0.0.1:{port}\) does not answer"):
        check_spark_connection("spark_cluster")


def test_yarn_needs_the_hadoop_configuration_and_a_host_is_required(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    define(monkeypatch, "spark_yarn", conn_type="spark", host="yarn")
    environment = {key: value for key, value in os.environ.items() if key not in ("HADOOP_CONF_DIR", "YARN_CONF_DIR")}
    with pytest.raises(ConnectionConfigError, match="needs HADOOP_CONF_DIR or YARN_CONF_DIR"):
        check_spark_connection("spark_yarn", environment)
    assert check_spark_connection("spark_yarn", {**environment, "HADOOP_CONF_DIR": str(tmp_path)}).master == "yarn"
    define(monkeypatch, "spark_empty", conn_type="spark")
    with pytest.raises(ConnectionConfigError, match="has no host, so the Spark provider would submit to YARN"):
        check_spark_connection("spark_empty")
    define(monkeypatch, "spark_odd", conn_type="spark", host="mycluster")
    with pytest.raises(ConnectionConfigError, match="names master 'mycluster', which spark-submit does not know"):
        check_spark_connection("spark_odd")


def test_the_operator_checks_before_it_submits(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from airflow_provider_babelqueue.operators.spark import BabelQueueSparkTriageOperator

    submitted: list[Any] = []
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, context: submitted.append(self))
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT", raising=False)
    pending = tmp_path / "pending"
    pending.mkdir()
    (pending / "dlq-a.jsonl").write_bytes(b"{}\n")
    operator = BabelQueueSparkTriageOperator(task_id="t", job="triage", input=str(pending / "dlq-a.jsonl"),
                                             output=str(tmp_path / "out"), pending=str(pending),
                                             archive_to=str(tmp_path / "archive"))
    with pytest.raises(ConnectionConfigError, match="'spark_default' is not defined"):
        operator.execute(context={})
    assert submitted == [] and waiting_files(str(pending)) == [str(pending / "dlq-a.jsonl")]  # nothing moved


def test_pending_files_are_listed_carried_and_moved(tmp_path: Path) -> None:
    pending, archive = tmp_path / "pending", tmp_path / "run" / "drain"
    pending.mkdir()
    for name in ("dlq-b.jsonl", "dlq-a.ndjson", ".dlq-c.jsonl", "_SUCCESS", "notes.txt"):
        (pending / name).write_bytes(b"x\n")
    (pending / "sub").mkdir()
    (pending / "sub" / "dlq-d.jsonl").write_bytes(b"x\n")
    waiting = waiting_files(str(pending))
    assert waiting == [str(pending / "dlq-a.ndjson"), str(pending / "dlq-b.jsonl")]
    assert waiting_files(f"file://{pending}") == waiting and waiting_files(str(tmp_path / "none")) == []
    assert carried_over(waiting, [f"file://{pending}/dlq-b.jsonl"]) == [str(pending / "dlq-a.ndjson")]
    assert file_key(f"file://{pending}/x.jsonl") == file_key(str(pending / "x.jsonl"))
    moved = move_into(waiting, str(archive))
    assert moved == [str(archive / "dlq-a.ndjson"), str(archive / "dlq-b.jsonl")]
    assert waiting_files(str(pending)) == [] and (archive / "dlq-b.jsonl").read_bytes() == b"x\n"
    assert move_into(moved, str(archive)) == moved  # already there: left as it is


def test_pending_files_on_object_storage(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same folder logic through ObjectStoragePath, on fsspec's in-memory file system, registered for the test
    as a provider registers its scheme (Airflow's registry has no ``memory`` scheme of its own)."""
    import fsspec
    from airflow.sdk import ObjectStoragePath
    from airflow.sdk.io import fs as airflow_fs

    monkeypatch.setitem(airflow_fs._register_filesystems(), "memory", lambda conn_id: fsspec.filesystem("memory"))

    base = f"memory://bq-pending-{os.getpid()}"
    ObjectStoragePath(f"{base}/pending/dlq-1.jsonl").write_bytes(b'{"v":1}\n')
    ObjectStoragePath(f"{base}/pending/dlq-2.jsonl").write_bytes(b'{"v":1}\n{"v":1}\n')
    waiting = waiting_files(f"{base}/pending")
    assert [path.rsplit("/", 1)[-1] for path in waiting] == ["dlq-1.jsonl", "dlq-2.jsonl"]
    moved = move_into(waiting, f"{base}/run/drain")
    assert [path.rsplit("/", 1)[-1] for path in moved] == ["dlq-1.jsonl", "dlq-2.jsonl"]
    assert waiting_files(f"{base}/pending") == []
    assert ObjectStoragePath(moved[1]).read_bytes() == b'{"v":1}\n{"v":1}\n'
