"""Packaging facts: pure envelope core, provider registration, extras, the pyspark guard, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import jsonschema
import pytest

from airflow_provider_babelqueue.core import verdicts
from airflow_provider_babelqueue.get_provider_info import get_provider_info
from tests.conftest import CONFORMANCE

FORBIDDEN_ROOTS = {
    "airflow",
    "redis",
    "pika",
    "boto3",
    "botocore",
    "azure",
    "pulsar",
    "sqlalchemy",
    "psycopg2",
    "pyspark",
    "jsonschema",
}
DIST = "airflow-provider-babelqueue"
ROOT = Path(__file__).resolve().parents[1]


PURE = ["airflow_provider_babelqueue.envelope", "airflow_provider_babelqueue.core.idempotency",
        "airflow_provider_babelqueue.core.records", "airflow_provider_babelqueue.core.errors"]


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_airflow_and_no_broker_client(module: str) -> None:
    code = f"import sys, {module}; print(sorted({{m.split('.')[0] for m in sys.modules}}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out.replace("'", '"')))
    assert "orjson" in loaded or module.endswith(("idempotency", "errors"))
    assert not loaded & FORBIDDEN_ROOTS, f"{module} pulled in {sorted(loaded & FORBIDDEN_ROOTS)}"


def _imports_of(path: Path) -> set[str]:
    """The absolute names a module imports (relative imports resolved against its package)."""
    import ast

    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


#: What each layer may import from the package: imports point one way (docs/development.md).
LAYERS = {
    "core": {"core"},
    "bindings": {"core", "bindings"},
    "engine": {"core", "bindings", "engine"},
    "spark": {"core", "spark"},
}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layers_import_one_way(layer: str) -> None:
    package = ROOT / "airflow_provider_babelqueue" / layer
    wrong = {}
    for path in sorted(package.rglob("*.py")):
        inner = {name.split(".")[1] for name in _imports_of(path)
                 if name.startswith("airflow_provider_babelqueue.") and name.count(".") >= 1}
        outside = inner - LAYERS[layer] - {"__version__"}
        if outside:
            wrong[str(path.relative_to(ROOT))] = sorted(outside)
    assert not wrong, f"{layer}/ imports from layers above it: {wrong}"


def test_distribution_metadata() -> None:
    dist = metadata.distribution(DIST)
    assert dist.metadata["Name"] == DIST
    requires = dist.requires or []
    assert any(
        r.replace(" ", "").startswith("apache-airflow<4,>=3.3.1")
        or r.replace(" ", "").startswith("apache-airflow>=3.3.1,<4")
        for r in requires
    ), requires
    assert any(r.startswith("orjson") for r in requires)
    assert any(r.startswith("msgspec") for r in requires)
    extras = set(dist.metadata.get_all("Provides-Extra") or [])
    assert {"redis", "rabbitmq", "sqs", "azure", "pulsar", "spark", "all"} <= extras
    spark = [r for r in requires if r.replace("'", '"').endswith('extra == "spark"')]
    assert any(r.startswith("pyspark==4.3.0") for r in spark), spark
    assert any(r.startswith("apache-airflow-providers-apache-spark") for r in spark), spark
    points = [ep for ep in dist.entry_points if ep.group == "apache_airflow_provider"]
    assert [ep.value for ep in points] == ["airflow_provider_babelqueue.get_provider_info:get_provider_info"]


def test_provider_info_is_valid_for_airflow() -> None:
    import airflow

    schema_path = Path(airflow.__file__).parent / "provider_info.schema.json"
    info = get_provider_info()
    jsonschema.validate(info, json.loads(schema_path.read_text()))
    assert info["package-name"] == DIST


def test_airflow_lists_the_provider() -> None:
    env = os.environ | {"AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    airflow = Path(sys.executable).parent / "airflow"
    result = subprocess.run(
        [str(airflow), "providers", "list", "--output", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    providers = {p["package_name"]: p for p in json.loads(result.stdout)}
    assert providers[DIST]["version"] == metadata.version(DIST)


def test_pyspark_is_4_3_0_and_not_overwritten_by_pyspark_client() -> None:
    import pyspark

    assert pyspark.__version__ == "4.3.0"
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.distribution("pyspark-client")


def test_verdicts_cli_over_the_conformance_fixtures(capsys: pytest.CaptureFixture[str]) -> None:
    assert verdicts.main([str(CONFORMANCE)]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[1:3] for line in out[1:-1]}
    assert rows["order-created.json"] == ["accept", "-"]
    assert rows["invalid-missing-urn.json"] == ["reject", "missing_urn"]
    assert rows["invalid-unknown-schema-version.json"] == ["reject", "unsupported_schema_version"]
    assert out[-1].startswith("4 accepted, 2 rejected")


def test_verdicts_reports_poison_and_missing_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "broken.json").write_bytes(b'{"job": ')
    assert verdicts.main([str(tmp_path)]) == 0
    assert "reject    poison" in capsys.readouterr().out
    assert verdicts.main([str(tmp_path / "nope.json")]) == 2
