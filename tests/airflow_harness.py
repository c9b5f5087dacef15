"""Run a DAG built inside a test under ``dag.test()``.

Airflow 3.3's ``dag.test()`` only runs DAGs that are serialized in the metadata DB, so the DAG is bagged
and synced first. The metadata DB must be migrated (``make test`` does it; otherwise the first call here
runs ``airflow db migrate`` on the test's ``AIRFLOW_HOME``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

_ready = False


def _ensure_db() -> None:
    global _ready
    if _ready:
        return
    home = Path(os.environ["AIRFLOW_HOME"])
    if not (home / "airflow.db").exists():
        airflow = Path(sys.executable).parent / "airflow"
        subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True, timeout=600)
    from airflow.dag_processing.bundles.manager import DagBundlesManager

    DagBundlesManager().sync_bundles_to_db()
    _ready = True


def run_dag(dag: Any, **test_kwargs: Any) -> Any:
    """Serialize ``dag`` into the DB and run it once with ``dag.test()``; returns the DagRun."""
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    _ensure_db()
    bag = DagBag(dag_folder="/dev/null")
    bag.bag_dag(dag)
    sync_bag_to_db(bag, bundle_name="dags-folder", bundle_version=None)
    return dag.test(**test_kwargs)


def task_states(dag_run: Any) -> dict[str, str]:
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(TaskInstance).filter(
            TaskInstance.dag_id == dag_run.dag_id, TaskInstance.run_id == dag_run.run_id
        )
        return {ti.task_id: str(ti.state) for ti in rows}


def xcom(dag_run: Any, task_id: str, key: str = "return_value", map_index: int = -1) -> Any:
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = (
            session.query(TaskInstance)
            .filter(
                TaskInstance.dag_id == dag_run.dag_id,
                TaskInstance.run_id == dag_run.run_id,
                TaskInstance.task_id == task_id,
                TaskInstance.map_index == map_index,
            )
            .one()
        )
        if map_index < 0:
            return ti.xcom_pull(task_ids=task_id, key=key)
        return ti.xcom_pull(task_ids=task_id, key=key, map_indexes=map_index)
