"""``BabelQueueReportLink``: the "Dead-letter report" button of a task that wrote the triage report.

Airflow 3 computes an operator's extra links on the worker, when the task finishes, and stores each URL as an
XCom (``_link_BabelQueueReportLink``); the UI shows the button when the URL is not empty. The URL opens the
provider's plugin (``airflow_provider_babelqueue.plugins``), which reads the report from the output root and
serves it behind Airflow's login: the XCom itself only holds a path on storage the browser cannot reach.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

__all__ = ["REPORTS_PATH", "BabelQueueReportLink", "report_url"]

#: The plugin's reports route: its ``URL_PREFIX`` and the reports router's prefix (a test keeps them equal;
#: they are spelled out here so that a task process need not import the plugin).
REPORTS_PATH = "/babelqueue/reports"


def report_url(dag_id: str, run_id: str, task_id: str, map_index: int = -1, *, base_url: str = "") -> str:
    """The plugin's URL of a task instance's report, relative to the site (``/babelqueue/reports/...``).

    :param base_url: ``[api] base_url``; only its path is kept (Airflow served under ``/airflow`` gives
        ``/airflow/babelqueue/...``), so the link stays on whatever host the UI was opened with.
    :param map_index: a mapped task instance's index (a ``map_index`` query parameter); -1 when not mapped.
    """
    root = urlsplit(base_url).path.rstrip("/") if base_url else ""
    url = f"{root}{REPORTS_PATH}/" + "/".join(quote(part, safe="") for part in (dag_id, run_id, task_id))
    return f"{url}?map_index={map_index}" if map_index >= 0 else url


def _wrote_report(ti_key: TaskInstanceKey) -> bool:
    """Whether the task instance's return value names a report (only then is there something to open)."""
    from airflow.sdk.execution_time.xcom import XCom

    value = XCom.get_value(ti_key=ti_key, key="return_value")
    return isinstance(value, dict) and bool(value.get("report"))


class BabelQueueReportLink(BaseOperatorLink):
    """Opens the report that the task wrote (``report`` in its return value) through the provider's plugin.

    Add it to an operator with ``operator_extra_links = (BabelQueueReportLink(),)``; it suits any task that
    returns ``{"report": "<output>/report.html", ...}`` as ``BabelQueueSparkTriageOperator`` does. A task that
    wrote no report (failed, or ``job="triage"`` without ``report_output``) gets an empty link, so the UI shows
    no button.
    """

    name = "Dead-letter report"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        if not _wrote_report(ti_key):
            return ""
        from airflow.sdk import conf

        base_url: Any = conf.get("api", "base_url", fallback="")
        return report_url(ti_key.dag_id, ti_key.run_id, ti_key.task_id, ti_key.map_index, base_url=base_url or "")
