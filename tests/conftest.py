"""Shared test setup: the public conformance suite and an isolated Airflow home.

The conformance suite is read from ``../shared/conformance`` relative to the project root (override with
``BABELQUEUE_CONFORMANCE``). Airflow gets a throwaway ``AIRFLOW_HOME`` unless ``make test`` set one.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="babelqueue-airflow-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

ROOT = Path(__file__).resolve().parents[1]
CONFORMANCE = Path(os.environ.get("BABELQUEUE_CONFORMANCE", ROOT.parent / "shared" / "conformance"))


def conformance_manifest() -> dict[str, Any]:
    path = CONFORMANCE / "manifest.json"
    if not path.is_file():
        pytest.fail(f"conformance suite not found at {path}; set BABELQUEUE_CONFORMANCE to its folder")
    return json.loads(path.read_text(encoding="utf-8"))


def fixture_bytes(relative: str) -> bytes:
    """A conformance fixture's file content, exactly as stored."""
    return (CONFORMANCE / relative).read_bytes()


def fixture_dict(relative: str) -> dict[str, Any]:
    return json.loads(fixture_bytes(relative))


def free_port() -> int:
    """A loopback TCP port nothing listens on right now (for test servers, or to reach a closed port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def take_all(binding: Any, queue_name: str, timeout: float = 0.0) -> list[bytes]:
    """Consume everything on ``queue_name`` (reserve + ack): the bodies, in order. Each reserve waits up to
    ``timeout`` seconds, for brokers that deliver a moment after a publish or a restart."""
    bodies = []
    while (message := binding.reserve(queue_name, timeout=timeout)) is not None:
        bodies.append(message.body)
        binding.ack(message)
    return bodies


def compact(value: Any) -> bytes:
    """The compact form every SDK writes: what a fixture looks like on the wire."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


@pytest.fixture(scope="session")
def manifest() -> dict[str, Any]:
    return conformance_manifest()


@pytest.fixture(scope="session")
def spark_class_archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path | None]:
    """One driver class-data archive for every ``spark-submit`` of the session, built by the product's own
    ``build_class_archive`` and set as the worker-wide ``BABELQUEUE_SPARK_CLASS_ARCHIVE`` (which the operator
    reads and the Spark tests' own submits pass on): each JVM then starts about 4 s sooner. ``None`` (nothing
    set) when Spark or Java is not installed; the tests that need Spark skip themselves then."""
    from airflow_provider_babelqueue.spark.class_archive import CLASS_ARCHIVE_ENV, build_class_archive
    from tests.spark.conftest import spark_env, spark_submit_path

    submit = spark_submit_path()
    if submit is None or shutil.which("java") is None:
        yield None
        return
    archive = build_class_archive(tmp_path_factory.mktemp("cds") / "driver.jsa", spark_submit=submit,
                                  env=spark_env())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CLASS_ARCHIVE_ENV, str(archive))
        yield archive
