"""Shared test setup: the public conformance suite and an isolated Airflow home.

The conformance suite is read from ``../shared/conformance`` relative to the project root (override with
``BABELQUEUE_CONFORMANCE``). Airflow gets a throwaway ``AIRFLOW_HOME`` unless ``make test`` set one; each
pytest-xdist worker then works in its own copy of it. The last hooks here order and group the modules for the
workers (docs/development.md).
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


def _worker_airflow_home() -> None:
    """Under pytest-xdist, give each worker its own Airflow home: a copy of the migrated metadata DB (when the
    run's home has one) beside its own logs and config, so two workers never write one SQLite file at once."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    shared = Path(os.environ["AIRFLOW_HOME"])
    home = shared / "xdist" / worker
    home.mkdir(parents=True, exist_ok=True)
    if (shared / "airflow.db").is_file() and not (home / "airflow.db").exists():
        shutil.copy(shared / "airflow.db", home / "airflow.db")
    os.environ["AIRFLOW_HOME"] = str(home)


_worker_airflow_home()

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


#: Test modules that share the session's Spark fixtures (the class archive, the one triage run): under
#: ``make test`` (pytest-xdist, ``--dist loadfile``) one worker takes them all, so each JVM-heavy fixture is
#: built once per run, not once per worker.
SPARK_GROUP = ("tests/spark/", "tests/dags/test_demo.py", "tests/dags/test_sample_dags.py",
               "tests/dags/test_triage_pending.py", "tests/dags/test_lineage_dag.py")
#: Spark modules that share none of the group's session fixtures (their own JVMs): units of their own, so the
#: other worker can take them.
SPARK_ALONE = ("tests/spark/test_standalone_cluster.py",)
#: The longest modules after the Spark group (tens of seconds each: real schedulers, killed children,
#: restarted brokers), started early so that neither worker is left with one of them at the end.
LONG_MODULES = (
    "tests/install/test_pip_install.py",
    "tests/spark/test_standalone_cluster.py",
    "tests/reliability/test_crashes.py",
    "tests/bindings/test_batched_consume.py",
    "tests/sensors/test_e2e_message_trigger.py",
    "tests/sensors/test_e2e_asset_watcher.py",
    "tests/dags/test_trigger_form.py",
    "tests/plugins/test_e2e_api_server.py",
    "tests/plugins/test_reports_app.py",
    "tests/reliability/test_secrets.py",
    "tests/reliability/test_outages.py",
    "tests/sensors/test_sensors.py",
)


def work_unit(nodeid: str) -> str:
    """The unit one worker runs whole: a module, or the Spark group."""
    path = nodeid.split("::", 1)[0]
    return "spark" if path.startswith(SPARK_GROUP) and path not in SPARK_ALONE else path


def _unit_rank(nodeid: str) -> int:
    unit = work_unit(nodeid)
    if unit == "spark":
        return 0
    if unit in LONG_MODULES:
        return 1 + LONG_MODULES.index(unit)
    return 1 + len(LONG_MODULES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest units first (stable: the order inside a unit is kept), so the workers finish together."""
    items.sort(key=lambda item: _unit_rank(item.nodeid))


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """For ``--dist loadfile``: xdist's file scheduling with the Spark modules as one unit, handing units out
    in collection order (longest first, see above) instead of by their number of tests."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class UnitScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False
    return UnitScheduling(config, log)
