"""Where a dead-letter pipeline run keeps its files, and the small readers its Python tasks share.

The sample DAGs (``dags/``) and ``make demo`` use these so that a run's drain file, triage Parquet, report and
replay set sit together under one folder named after the run, and so that the dry-run gate and the demo's summary
read the Spark jobs' summaries the same way. Nothing here touches a broker.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .engine.drain.sinks import safe_segment

__all__ = ["FOLDERS", "default_output_root", "read_json", "run_workspace", "summary_table"]

#: The sub-folders of a run's workspace, in pipeline order.
FOLDERS = ("drain", "triage", "report", "replay_set")


def default_output_root() -> str:
    """``$AIRFLOW_HOME/babelqueue/runs``: beside the embedded queue, on the machine that runs the tasks."""
    home = Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser()
    return str(home / "babelqueue" / "runs")


def _is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def run_workspace(output_root: str | None, dag_id: str, run_id: str) -> dict[str, str]:
    """The folders of one run: ``<output_root>/<dag_id>/<run id made path-safe>/{drain,triage,report,replay_set}``.

    :param output_root: a local folder or an object-storage / Hadoop URL (``s3://...``); blank means
        :func:`default_output_root`. A relative local path is made absolute, because spark-submit may run in
        another working directory than the task.
    :param run_id: the Airflow run id; ``:`` and ``+`` in it are replaced because Hadoop paths refuse ``:``.
    """
    root = (output_root or "").strip() or default_output_root()
    if root.startswith("file://"):
        root = root[len("file://"):]
    if not _is_url(root):
        root = str(Path(root).expanduser().resolve())
    base = f"{root.rstrip('/')}/{safe_segment(dag_id)}/{safe_segment(run_id)}"
    return {"root": base, **{folder: f"{base}/{folder}" for folder in FOLDERS}}


def read_json(path: str) -> Any:
    """A JSON document from a local path, a ``file://`` URL or any ``ObjectStoragePath`` URL."""
    if _is_url(path):
        from airflow.sdk import ObjectStoragePath

        return json.loads(ObjectStoragePath(path).read_text())
    local = path[len("file://"):] if path.startswith("file://") else path
    return json.loads(Path(local).read_text(encoding="utf-8"))


def summary_table(rows: Mapping[str, Any], headers: tuple[str, str] = ("reason", "count"), *,
                  total: bool = False) -> str:
    """A small fixed-width text table for task logs and the demo's output.

    :param total: add a ``total`` row (the values must be numbers).
    """
    items = [(str(key), str(value)) for key, value in rows.items()]
    if total:
        items.append(("total", str(sum(rows.values()))))
    left = max([len(headers[0]), *(len(key) for key, _ in items)])
    right = max([len(headers[1]), *(len(value) for _, value in items)])
    lines = [f"{headers[0]:<{left}}  {headers[1]:>{right}}", f"{'-' * left}  {'-' * right}"]
    lines += [f"{key:<{left}}  {value:>{right}}" for key, value in items]
    return "\n".join(lines)
