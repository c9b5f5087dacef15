"""Reference pages list every operator parameter; a new parameter without docs fails here."""

from __future__ import annotations

import inspect
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
}


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
