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
from .locations import is_object_storage, local_path

__all__ = ["FOLDERS", "default_output_root", "read_json", "run_workspace", "shared_storage_warning",
           "summary_table"]

#: The sub-folders of a run's workspace, in pipeline order.
FOLDERS = ("drain", "triage", "report", "replay_set")


def default_output_root() -> str:
    """``[babelqueue] output_root`` when set (a shared folder or an object-storage URL every worker reaches), else
    ``$AIRFLOW_HOME/babelqueue/runs``: beside the embedded queue, on the machine that runs the tasks."""
    configured = ""
    try:
        from airflow.configuration import conf
    except ImportError:  # Spark-side code that imports this module has no Airflow
        pass
    else:
        configured = (conf.get("babelqueue", "output_root", fallback="") or "").strip()
    if configured:
        return configured
    home = Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser()
    return os.path.abspath(home / "babelqueue" / "runs")  # a relative AIRFLOW_HOME means the folder it names now


def run_workspace(output_root: str | None, dag_id: str, run_id: str) -> dict[str, str]:
    """The folders of one run: ``<output_root>/<dag_id>/<run id made path-safe>/{drain,triage,report,replay_set}``,
    and the DAG's ``pending`` folder, ``<output_root>/<dag_id>/_pending``: drains write there, and a triage that
    succeeded moves the files it read into the run's ``drain`` folder (``operators/pending.py``), so a dead letter
    that left the broker is always where the next run's triage looks.

    :param output_root: a local folder or an object-storage / Hadoop URL (``s3://...``); blank means
        :func:`default_output_root`. A relative local path is made absolute, because spark-submit may run in
        another working directory than the task.
    :param run_id: the Airflow run id; ``:`` and ``+`` in it are replaced because Hadoop paths refuse ``:``.
    """
    root = (output_root or "").strip() or default_output_root()
    root = local_path(root)
    if not is_object_storage(root):
        root = str(Path(root).expanduser().resolve())
    dag_folder = f"{root.rstrip('/')}/{safe_segment(dag_id)}"
    base = f"{dag_folder}/{safe_segment(run_id)}"
    return {"root": base, **{folder: f"{base}/{folder}" for folder in FOLDERS}, "pending": f"{dag_folder}/_pending"}


#: Executors that run every task on the machine that runs the scheduler, where a local output root is shared.
_LOCAL_EXECUTORS = frozenset({"LocalExecutor", "SequentialExecutor", "DebugExecutor"})


def shared_storage_warning(root: str, executors: str) -> str | None:
    """A warning for the task log when ``root`` is a local folder but tasks may run on several machines.

    The drain file, the triage output, the report and the pending folder must be reachable from every worker
    (and from the api-server that serves the report): with a remote executor, a local output root leaves each
    worker its own copy. None when the root is an object-storage URL or every executor is local.

    :param root: the output root or any folder under it.
    :param executors: Airflow's ``[core] executor`` setting (a comma-separated list; entries may be
        ``alias:module.Class``).
    """
    if is_object_storage(root.strip()):
        return None
    names = [entry.strip().rsplit(":", 1)[-1].rsplit(".", 1)[-1] for entry in executors.split(",") if entry.strip()]
    remote = [name for name in names if name not in _LOCAL_EXECUTORS]
    if not remote:
        return None
    return (f"the output root {root} is a folder on this worker, but the {', '.join(remote)} may run this DAG's "
            "tasks on other machines, which would not see its files (the pending drain files, the triage output, "
            "the report). Give output_root an object-storage URL (s3://..., gs://..., abfs://...) or a folder "
            "every worker and the api-server share (docs/dags.md).")


def read_json(path: str) -> Any:
    """A JSON document from a local path, a ``file://`` URL or any ``ObjectStoragePath`` URL."""
    if is_object_storage(path):
        from airflow.sdk import ObjectStoragePath

        return json.loads(ObjectStoragePath(path).read_text())
    return json.loads(Path(local_path(path)).read_text(encoding="utf-8"))


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
