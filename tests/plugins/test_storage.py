"""Which locations the plugin reads: only the route's file, under a report root, with no way out of it by
``..``, a symbolic link or a look-alike prefix. Pure checks: no Airflow, no DB."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_babelqueue.plugins.storage import (
    LocationRefused,
    _location,
    checked_location,
    read_limited,
)


@pytest.fixture()
def tree(tmp_path: Path) -> dict[str, Path]:
    runs, secret = tmp_path / "runs", tmp_path / "secret"
    (runs / "dag" / "run" / "report").mkdir(parents=True)
    secret.mkdir()
    (secret / "report.html").write_text("SECRET")
    (runs / "dag" / "run" / "report" / "report.html").write_text("REPORT")
    (runs / "escape").symlink_to(secret, target_is_directory=True)
    (tmp_path / "runs-evil").mkdir()
    (tmp_path / "runs-evil" / "report.html").write_text("SECRET")
    return {"root": runs, "secret": secret, "base": tmp_path}


def roots(*texts: str) -> list:
    return [_location(text) for text in texts]


def test_a_report_under_its_root_is_read_by_path_and_by_file_url(tree: dict[str, Path]) -> None:
    root = roots(str(tree["root"]))
    page = tree["root"] / "dag" / "run" / "report" / "report.html"
    for text in (str(page), page.as_uri(), f"file://{page}"):
        assert read_limited(checked_location(text, "report.html", root)) == b"REPORT"
    # the root may itself be given as a file:// URL
    assert checked_location(str(page), "report.html", roots(tree["root"].as_uri())).path == str(page)


@pytest.mark.parametrize("relative", [
    "../secret/report.html",  # up and out
    "dag/../../secret/report.html",
    "escape/report.html",  # a symbolic link inside the root pointing outside it
    "../runs-evil/report.html",  # a sibling folder whose name starts with the root's
])
def test_nothing_outside_the_root_is_read(tree: dict[str, Path], relative: str) -> None:
    text = f"{tree['root']}/{relative}"
    with pytest.raises(LocationRefused, match="outside the report roots"):
        checked_location(text, "report.html", roots(str(tree["root"])))


@pytest.mark.parametrize("text, why", [
    ("{root}/dag/run/report/summary.json", "is not a report.html"),
    ("{root}/dag/run/report/report.html.bak", "is not a report.html"),
    ("dag/run/report/report.html", "not an absolute path"),
    ("", "empty"),
    ("file://otherhost{root}/report.html", "not an absolute path"),
])
def test_only_an_absolute_path_to_the_routes_file_name_is_read(tree: dict[str, Path], text: str, why: str) -> None:
    with pytest.raises(LocationRefused, match=why):
        checked_location(text.format(root=tree["root"]), "report.html", roots(str(tree["root"])))


@pytest.mark.parametrize("value", [None, 42, ["/x/report.html"], {"report": "/x/report.html"}])
def test_an_xcom_that_is_not_a_string_is_refused(value: object) -> None:
    with pytest.raises(LocationRefused, match="not a string"):
        checked_location(value, "report.html", roots("/tmp"))


def test_urls_stay_in_their_bucket_and_prefix() -> None:
    allowed = roots("s3://dlq-reports/runs", "memory://reports/runs/")
    ok = checked_location("s3://aws_default@dlq-reports/runs/d/r/report/report.html", "report.html", allowed)
    assert (ok.scheme, ok.host, ok.path) == ("s3", "dlq-reports", "/runs/d/r/report/report.html")
    assert ok.source.startswith("s3://aws_default@")  # the connection id is kept for reading
    assert checked_location("memory://reports/runs//x/report.html", "report.html", allowed).path == \
        "/runs/x/report.html"
    for text, why in [
        ("s3://dlq-reports/runs/../secrets/report.html", "'.' or '..' segment"),
        ("s3://dlq-reports/runs/./report.html", "'.' or '..' segment"),
        ("s3://dlq-reports/runs-old/report.html", "outside the report roots"),
        ("s3://other-bucket/runs/report.html", "outside the report roots"),
        ("gs://dlq-reports/runs/report.html", "outside the report roots"),
        ("s3://dlq-reports/runs/report.html?versionId=1", "query or fragment"),
        ("/dlq-reports/runs/report.html", "outside the report roots"),
    ]:
        with pytest.raises(LocationRefused, match=why.replace(".", r"\.").replace("?", r"\?")):
            checked_location(text, "report.html", allowed)


def test_the_default_root_is_the_default_output_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from airflow_provider_babelqueue.plugins.storage import allowed_roots

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.delenv("AIRFLOW__BABELQUEUE__REPORT_ROOTS", raising=False)
    assert [str(root) for root in allowed_roots()] == [str(tmp_path / "babelqueue" / "runs")]
    monkeypatch.setenv("AIRFLOW__BABELQUEUE__REPORT_ROOTS", f" {tmp_path}/a , s3://b/runs ,")
    assert [str(root) for root in allowed_roots()] == [f"{tmp_path}/a", "s3://b/runs"]


def test_an_oversized_file_is_not_loaded(tree: dict[str, Path]) -> None:
    page = tree["root"] / "dag" / "run" / "report" / "report.html"
    location = checked_location(str(page), "report.html", roots(str(tree["root"])))
    assert read_limited(location, limit=6) == b"REPORT"
    with pytest.raises(LocationRefused, match="larger than 5 bytes"):
        read_limited(location, limit=5)


def test_a_scheme_without_a_filesystem_on_the_api_server_is_an_os_error() -> None:
    with pytest.raises(OSError, match="nofs"):  # "Unsupported filesystem" or "No filesystem registered"
        read_limited(checked_location("nofs://b/runs/report.html", "report.html", roots("nofs://b/runs")))
