"""The report link's URL is the plugin's route, escaped, under Airflow's base path."""

from __future__ import annotations

import pytest

from airflow_provider_babelqueue.operators.links import REPORTS_PATH, BabelQueueReportLink, report_url


def test_the_link_points_at_the_plugins_reports_route() -> None:
    from airflow_provider_babelqueue.plugins.plugin import URL_PREFIX
    from airflow_provider_babelqueue.plugins.reports import router

    assert REPORTS_PATH == URL_PREFIX + router.prefix
    assert BabelQueueReportLink().name == "Dead-letter report"
    assert BabelQueueReportLink().xcom_key == "_link_BabelQueueReportLink"


@pytest.mark.parametrize("base_url, expected_root", [
    ("", ""),
    ("http://localhost:8080", ""),
    ("http://localhost:8080/", ""),
    ("https://airflow.example.com/airflow/", "/airflow"),
    ("/team-a", "/team-a"),
])
def test_the_url_is_relative_to_the_site_under_airflows_base_path(base_url: str, expected_root: str) -> None:
    url = report_url("dlq", "manual__2025-01-02T03:04:05.678+00:00", "group.triage", base_url=base_url)
    assert url == f"{expected_root}/babelqueue/reports/dlq/manual__2025-01-02T03%3A04%3A05.678%2B00%3A00/group.triage"


def test_ids_are_escaped_and_a_mapped_instance_names_its_index() -> None:
    assert report_url("a b", "r/1?x#y", "t%", 3) == "/babelqueue/reports/a%20b/r%2F1%3Fx%23y/t%25?map_index=3"
    assert report_url("d", "r", "t", 0).endswith("/t?map_index=0")
    assert report_url("d", "r", "t", -1).endswith("/t")
