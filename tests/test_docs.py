"""The documentation site: it builds in strict mode, reference pages list every parameter, every connection type
has a complete page, and the examples come from the sample DAGs (included, not pasted)."""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# operator class path → its reference page
PAGES = {
    "airflow_provider_babelqueue.operators.publish.BabelQueuePublishOperator": "docs/operators/publish.md",
    "airflow_provider_babelqueue.operators.consume.BabelQueueConsumeOperator": "docs/operators/consume.md",
    "airflow_provider_babelqueue.operators.drain.BabelQueueDrainDeadLettersOperator": "docs/operators/drain.md",
    "airflow_provider_babelqueue.operators.replay.BabelQueueReplayOperator": "docs/operators/replay.md",
    "airflow_provider_babelqueue.sensors.queue.BabelQueueQueueDepthSensor": "docs/sensors.md",
    "airflow_provider_babelqueue.operators.spark.BabelQueueSparkTriageOperator": "docs/operators/spark.md",
    "airflow_provider_babelqueue.sensors.queue.BabelQueueDeadLetterSensor": "docs/sensors.md",
    "airflow_provider_babelqueue.triggers.queue.BabelQueueDepthTrigger": "docs/sensors.md",
    "airflow_provider_babelqueue.triggers.queue.BabelQueueDeadLetterTrigger": "docs/sensors.md",
}
MKDOCS = str(Path(sys.executable).parent / "mkdocs")


def parameters(path: str) -> list[str]:
    module, _, name = path.rpartition(".")
    cls = getattr(import_module(module), name)
    signature = inspect.signature(cls.__init__)
    return [p for p, spec in signature.parameters.items() if p != "self" and spec.kind is not spec.VAR_KEYWORD]


@pytest.mark.parametrize("path", sorted(PAGES))
def test_every_operator_parameter_is_on_its_page(path: str) -> None:
    page = (ROOT / PAGES[path]).read_text(encoding="utf-8")
    missing = [p for p in parameters(path) if f"`{p}`" not in page]
    assert not missing, f"{PAGES[path]} does not document {missing}"


@pytest.mark.parametrize("path", sorted(PAGES))
def test_every_operator_parameter_has_a_docstring_entry(path: str) -> None:
    module, _, name = path.rpartition(".")
    doc = inspect.getdoc(getattr(import_module(module), name)) or ""
    missing = [p for p in parameters(path) if f":param {p}:" not in doc]
    assert not missing, f"{path} docstring lacks :param: for {missing}"


def build_site(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([MKDOCS, "build", "--strict", "--site-dir", str(site)], cwd=project, capture_output=True,
                          text=True, timeout=300, check=False)


def test_the_site_builds_in_strict_mode_with_the_dag_examples_included(tmp_path: Path) -> None:
    done = build_site(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    dags_page = re.sub(r"<[^>]+>", "", (tmp_path / "site" / "dags" / "index.html").read_text())  # text only
    assert "BabelQueueDrainDeadLettersOperator(\n        task_id=\"drain\"" in dags_page
    assert "--8&lt;--" not in dags_page
    changelog = (tmp_path / "site" / "changelog" / "index.html").read_text()
    assert "Keep a Changelog" in changelog


def test_strict_mode_fails_on_a_broken_link(tmp_path: Path) -> None:
    """The negative control: the same site with one broken link must not build."""
    project = tmp_path / "project"
    for name in ("docs", "dags"):
        shutil.copytree(ROOT / name, project / name)
    for name in ("mkdocs.yml", "CHANGELOG.md"):
        shutil.copy(ROOT / name, project / name)
    page = project / "docs" / "runbook.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    done = build_site(project, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stdout + done.stderr


def connection_pages() -> dict[str, Path]:
    from airflow_provider_babelqueue.get_provider_info import get_provider_info

    # the page is named after the hook's module: airflow_provider_babelqueue.hooks.azure_service_bus → azure-service-bus
    entries = get_provider_info()["connection-types"]
    return {e["connection-type"]: ROOT / "docs" / "connections" /
            (e["hook-class-name"].split(".")[-2].replace("_", "-") + ".md") for e in entries}


@pytest.mark.parametrize("conn_type", sorted(connection_pages()))
def test_every_connection_type_has_a_complete_page_in_the_nav(conn_type: str) -> None:
    page = connection_pages()[conn_type]
    assert page.is_file(), f"{conn_type} has no page {page.relative_to(ROOT)}"
    text = page.read_text(encoding="utf-8")
    for needle in ("## Fields", "## Extras", f'"conn_type": "{conn_type}"', "AIRFLOW_CONN_", "TLS",
                   "## What CI verifies"):
        assert needle in text, f"{page.name} lacks {needle!r}"
    assert f"connections/{page.name}" in (ROOT / "mkdocs.yml").read_text()


@pytest.mark.parametrize("page", ["operators/publish.md", "operators/consume.md", "operators/drain.md",
                                  "operators/replay.md", "operators/spark.md", "sensors.md", "dags.md"])
def test_reference_examples_are_included_from_the_sample_dags(page: str) -> None:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    includes = [line for line in text.splitlines() if line.startswith('--8<-- "dags/')]
    assert includes, f"{page} includes no example from dags/"
    for line in includes:
        path, _, section = line.split('"')[1].partition(":")
        source = (ROOT / path).read_text(encoding="utf-8")
        assert f"[start:{section}]" in source and f"[end:{section}]" in source, line
