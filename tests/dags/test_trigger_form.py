"""The sample DAGs can be triggered from the Airflow UI's trigger form with their defaults (issue #30).

The API and the CLI accept any params that validate against their schemas, but Airflow 3.3's React trigger form
adds a rule of its own: it disables its Trigger button while a param it counts as *required* has no value, and
for a string param an empty string counts as no value. Its only hint is a red "!" beside the "Run Parameters"
section header (no message at the field, whose own check looks for null alone). A sample DAG whose optional
string param defaulted to ``""`` could so be run from the CLI but not from the UI.

How the form decides, read from the UI Airflow 3.3.2 ships (``airflow/ui/dist/assets/index-1ifPC3Lo.js``, one
minified line, 6470; the upstream sources are ``airflow-core/src/airflow/ui/src/components/``):

- *required* (``FlexibleForm/isParamRequired.tsx``, ``isRequired``; bundle 6470:3989): the schema has a truthy
  ``type`` (in JavaScript even an empty list is truthy), and that type is not a list containing ``"null"``.
- *missing* (``FlexibleForm/FlexibleForm.tsx``, the section check; bundle 6470:7253): a required param whose
  value is ``null``, ``undefined`` or ``""``. Any missing param puts the "!" on its section and sets the form's
  error (bundle 6470:8388).
- the Trigger button (``TriggerDag/TriggerDAGForm.tsx``, ``data-testid="trigger-dag-submit"``; bundle
  6470:19184) is disabled while that error is set (or the JSON conf or the dates are invalid).
- ``minLength``, ``maxLength``, ``pattern`` and ``enum`` are not checked by the form (they only become input
  attributes or a dropdown); the server checks them when the run is created.
- the values come from ``GET /api/v2/dags/{dag_id}/details``: each param's ``dump()``
  (``api_fastapi/core_api/datamodels/dags.py``, ``get_params``), whose value is the default only if it validates
  against the param's own schema and is null otherwise (``serialization/definitions/param.py``,
  ``SerializedParam.dump`` and ``resolve``). So a default that breaks its own ``minLength`` reaches the form as
  null, and counts as missing if the param is required.

:func:`form_params` takes the values the way the API does (with Airflow's own code), :func:`trigger_blockers`
applies the form's rules to them; the slow test at the end checks both against the real form in Chromium.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.browser import CHROMIUM
from tests.conftest import free_port
from tests.dags.test_sample_dags import DAGS, SAMPLE_DAGS

# --- the form's rules, in Python -------------------------------------------------------------------------------


def _js_truthy(value: Any) -> bool:
    """JavaScript's truthiness, which the form's ``Boolean(...)`` applies: unlike Python's, an empty list or an
    empty object is true."""
    if value is None or value is False:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value != 0 and value == value  # 0 and NaN are false
    if isinstance(value, str):
        return value != ""
    return True


def form_requires(spec: Mapping[str, Any]) -> bool:
    """``isRequired``: a schema type is given and does not allow null."""
    kind = (spec.get("schema") or {}).get("type")
    return _js_truthy(kind) and not (isinstance(kind, list) and "null" in kind)


def form_counts_missing(spec: Mapping[str, Any]) -> bool:
    """The section check: a required param whose value is null, absent or the empty string."""
    value = spec.get("value")
    return form_requires(spec) and (value is None or (isinstance(value, str) and value == ""))


def trigger_blockers(params: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The params that keep the form's Trigger button disabled, given the API's view of a DAG's params."""
    return [name for name, spec in params.items() if form_counts_missing(spec)]


def form_params(dag: Any) -> dict[str, dict[str, Any]]:
    """A DAG's params as the trigger form receives them: serialized as the DAG processor stores the DAG, then
    dumped as ``GET /api/v2/dags/{dag_id}/details`` does (``DAGDetailsResponse.get_params``)."""
    from airflow.serialization.serialized_objects import DagSerialization

    serialized = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    return {name: dict(param.dump()) for name, param in serialized.params.items()}


def _dag_with(**params: Any) -> Any:
    from airflow.sdk import DAG

    with DAG(f"trigger_form_{uuid.uuid4().hex[:8]}", schedule=None, params=params) as dag:
        pass
    return dag


@pytest.fixture(scope="module")
def sample_dags() -> dict[str, Any]:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert not bag.import_errors, bag.import_errors
    assert set(bag.dag_ids) == set(SAMPLE_DAGS), "the test must see every sample DAG and only those"
    return {dag_id: bag.get_dag(dag_id) for dag_id in sorted(bag.dag_ids)}


def test_every_sample_dag_triggers_from_the_form_with_its_defaults(sample_dags: dict[str, Any]) -> None:
    """Every param of every sample DAG, as the form sees it: nothing keeps the Trigger button disabled, and the
    values the form then sends (the defaults) pass the server's own validation when the run is created."""
    from airflow.serialization.serialized_objects import DagSerialization

    for dag_id, dag in sample_dags.items():
        params = form_params(dag)
        blockers = {name: params[name] for name in trigger_blockers(params)}
        assert not blockers, (
            f"{dag_id}: the UI's trigger form counts these params as missing and disables Trigger: {blockers}. "
            "Give an optional param a nullable type and a null default (type=['null', 'string'], None), "
            "or a non-empty default.")
        serialized = DagSerialization.from_dict(DagSerialization.to_dict(dag))
        sent = {name: spec["value"] for name, spec in params.items()}
        assert serialized.params.deep_merge(sent).validate() == sent, dag_id


@pytest.mark.parametrize(("param", "blocks"), [
    pytest.param({"default": "", "type": "string"}, True, id="blank-string-the-issue"),
    pytest.param({"default": None, "type": "string"}, True, id="null-string"),
    # The API sends null for a default that fails its own schema, and null is missing for a required param.
    pytest.param({"default": "ab", "type": "string", "minLength": 3}, True, id="default-breaks-minLength"),
    pytest.param({"default": None, "type": ["null", "integer"]}, False, id="nullable-null"),
    pytest.param({"default": "", "type": ["null", "string"]}, False, id="nullable-blank"),
    pytest.param({"default": "x", "type": "string", "minLength": 1}, False, id="non-empty-string"),
    pytest.param({"default": False, "type": "boolean"}, False, id="false"),
    pytest.param({"default": 0, "type": "integer"}, False, id="zero"),
    pytest.param({"default": [], "type": "array"}, False, id="empty-array"),
    pytest.param({"default": {}, "type": "object"}, False, id="empty-object"),
    pytest.param({"default": ""}, False, id="no-type"),
])
def test_the_check_catches_what_the_form_refuses(param: dict[str, Any], blocks: bool) -> None:
    """The rules above on single params: the issue's ``Param("", type="string")`` is caught, and values the form
    accepts (false, 0, empty containers, anything nullable or untyped) are not."""
    from airflow.sdk import Param

    schema = dict(param)
    default = schema.pop("default")
    params = form_params(_dag_with(p=Param(default, **schema)))
    assert trigger_blockers(params) == (["p"] if blocks else []), params


def test_the_rules_match_javascript_on_edge_values() -> None:
    """``Boolean([])`` is true in JavaScript, so an (odd) empty type list still makes a param required."""
    assert form_requires({"schema": {"type": []}, "value": None})
    assert not form_requires({"schema": {}, "value": None})
    assert not form_requires({"schema": {"type": ["string", "null"]}})
    assert form_counts_missing({"schema": {"type": "string"}})  # no value key at all: undefined
    assert not form_counts_missing({"schema": {"type": "number"}, "value": 0})


# --- the real form, in headless Chromium ------------------------------------------------------------------------

BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-proxy-server",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--hide-scrollbars", "--remote-debugging-port=0"]
#: Loopback only, whatever proxy the environment names.
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))

#: A control DAG with the issue's param: the real form must refuse it, or the browser test proves nothing.
CONTROL_DAG = textwrap.dedent("""
    from airflow.sdk import DAG, Param

    with DAG("trigger_form_control", schedule=None, params={"note": Param("", type="string")}) as dag:
        pass
""")


class DevTools:
    """A page of a headless Chromium driven over the Chrome DevTools Protocol (one websocket, one call at a
    time): enough to load the UI, read the DOM, click like a person and take a screenshot."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        request = next(self.ids)
        self.socket.send(json.dumps({"id": request, "method": method, "params": params}))
        while True:  # events (none are enabled) and stale replies are skipped
            reply = json.loads(self.socket.recv(timeout=30))
            if reply.get("id") == request:
                assert "error" not in reply, f"{method}: {reply['error']}"
                return reply.get("result", {})

    def js(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def wait_for(self, expression: str, what: str, timeout: float = 30, *, required: bool = True) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := self.js(expression):
                return value
            time.sleep(0.2)
        if required:
            pytest.fail(f"{what}: not within {timeout:.0f} s (page {self.js('location.href')})")
        return None

    def settled(self, expression: str, timeout: float = 10) -> Any:
        """The value once three reads 0.2 s apart agree: React applies the form's checks in effects."""
        seen: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(seen) < 3 or len(set(map(json.dumps, seen[-3:]))) > 1:
            assert time.monotonic() < deadline, f"{expression} kept changing: {seen[-5:]}"
            seen.append(self.js(expression))
            time.sleep(0.2)
        return seen[-1]

    def _box(self, selector: str) -> dict[str, float]:
        return self.js(f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                       ".getBoundingClientRect(); return {x: r.x, y: r.y, width: r.width, height: r.height}; })()")

    def click(self, selector: str) -> None:
        """A real mouse click at the element's centre (so nothing may cover it), not ``element.click()``."""
        self.js(f"document.querySelector({json.dumps(selector)}).scrollIntoView({{block: 'center'}})")
        box = self._box(selector)
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def clear(self, selector: str) -> None:
        """Empty a text field as a person does: click into it, select all, press Backspace (real key events, so
        the form's own change handler runs)."""
        self.click(selector)
        self.js(f"document.querySelector({json.dumps(selector)}).select()")
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key="Backspace", code="Backspace",
                      windowsVirtualKeyCode=8, nativeVirtualKeyCode=8)

    def clear_editor(self, selector: str) -> None:
        """Empty the JSON editor inside ``selector`` as a person does: click into its text, Ctrl+A, Backspace."""
        self.click(f"{selector} .monaco-editor .view-lines")
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key="a", code="KeyA", windowsVirtualKeyCode=65,
                      modifiers=2, commands=["selectAll"] if kind == "keyDown" else [])
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key="Backspace", code="Backspace",
                      windowsVirtualKeyCode=8, nativeVirtualKeyCode=8)

    def screenshot(self, path: Path, selector: str) -> Path:
        """A PNG of the element (with a margin), e.g. the trigger dialog."""
        box = self._box(selector)
        clip = {"x": max(box["x"] - 8, 0), "y": max(box["y"] - 8, 0), "width": box["width"] + 16,
                "height": box["height"] + 16, "scale": 1}
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png", clip=clip)["data"]))
        return path


@contextmanager
def chromium_page(profile: Path, width: int, height: int) -> Iterator[DevTools]:
    """Headless Chromium (Debian's package: no browser is downloaded) with one page of the given viewport."""
    from websockets.sync.client import connect

    assert CHROMIUM is not None
    process = subprocess.Popen([CHROMIUM, *BROWSER_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file, deadline = profile / "DevToolsActivePort", time.monotonic() + 30
        while not (port_file.is_file() and len(port_file.read_text().splitlines()) >= 2):
            assert process.poll() is None, "chromium exited at start-up"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port within 30 s"
            time.sleep(0.1)
        port = port_file.read_text().splitlines()[0]
        targets = json.load(_LOCAL.open(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(target for target in targets if target["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10) as socket:
            browser = DevTools(socket)
            browser.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                         mobile=False)
            yield browser
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """``airflow api-server`` (SimpleAuthManager, everyone admin; the REST API and the UI, no execution API) on a
    free loopback port, with its own Airflow home whose DAGs folder holds the triage DAG and the control DAG, both
    serialized into its metadata DB. (Only those two: every file there is parsed at start-up, and the other sample
    DAGs' forms follow from the Python check once the browser has confirmed it both ways.)"""
    home, port = tmp_path / "airflow", free_port()
    dags = home / "dags"
    dags.mkdir(parents=True)
    shutil.copy(DAGS / f"{TRIAGE}.py", dags / f"{TRIAGE}.py")
    (dags / "trigger_form_control.py").write_text(CONTROL_DAG)
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
           "AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": str(port),
           "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex, "AIRFLOW__API__SECRET_KEY": uuid.uuid4().hex}
    airflow = str(Path(sys.executable).parent / "airflow")
    migrated = Path(os.environ["AIRFLOW_HOME"]) / "airflow.db"  # this worker's, migrated once (tests/conftest.py)
    if migrated.is_file():
        shutil.copy(migrated, home / "airflow.db")
    else:
        subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    log = tmp_path / "api-server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [airflow, "api-server", "--apps", "core", "--host", "127.0.0.1", "--port", str(port)], env=env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # The DAGs are serialized while the server starts (both take seconds; the server reads them per request).
        done = subprocess.run([airflow, "dags", "reserialize"], env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
        while True:
            assert server.poll() is None, f"the api-server exited: {log.read_text()[-3000:]}"
            try:
                if _LOCAL.open(f"{base}/api/v2/monitor/health", timeout=5).status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"the api-server did not answer within 120 s: {log.read_text()[-3000:]}"
            time.sleep(0.5)
        yield {"base": base, "db": home / "airflow.db", "dags": dags}
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


def _runs(db: Path, dag_id: str) -> dict[str, dict[str, Any]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as connection:
        rows = connection.execute("SELECT run_id, run_type, conf FROM dag_run WHERE dag_id = ?", (dag_id,))
        return {run_id: {"run_type": run_type, "conf": json.loads(conf) if conf else None}
                for run_id, run_type, conf in rows}


TRIAGE = "babelqueue_dlq_triage_report"
SUBMIT = '[data-testid="trigger-dag-submit"]'
DIALOG = f'[role="dialog"]:has({SUBMIT})'  # the trigger dialog, not a hidden popover's


def _open_trigger_form(browser: DevTools, base: str, dag_id: str, first_param: str) -> bool:
    """Open the DAG's page, press its Trigger button, wait for the params to render; whether the form's own
    Trigger button is disabled, once the form's checks have run."""
    browser.call("Page.navigate", url=f"{base}/dags/{dag_id}")
    opener = '[data-testid="trigger-dag-button"]'
    browser.wait_for(f"(b => b !== null && !b.disabled)(document.querySelector('{opener}'))",
                     f"{dag_id}: the Trigger button of the DAG page", timeout=60)
    browser.click(opener)
    browser.wait_for(f"document.querySelector('#element_{first_param}') !== null && "
                     f"document.querySelector('{SUBMIT}') !== null", f"{dag_id}: the trigger form's params")
    # The JSON fields' editor loads lazily; the form's values do not depend on it, only the screenshot does.
    browser.wait_for("!document.body.innerText.includes('Loading...')", "the JSON editors", 15, required=False)
    return bool(browser.settled(f"document.querySelector('{SUBMIT}').disabled"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_trigger_form_in_chromium_starts_the_triage_dag_with_its_defaults(api_server: dict[str, Any],
                                                                              tmp_path: Path) -> None:
    """The real UI: the control DAG (``Param("", type="string")``) gets a disabled Trigger button, as the check
    above predicts; ``babelqueue_dlq_triage_report`` gets an enabled one, and pressing it creates a manual run
    whose conf is exactly the DAG's defaults.

    Screenshots of both forms go to ``$BABELQUEUE_TRIGGER_FORM_SCREENSHOTS`` (a folder) when set, else to the
    test's temporary folder."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (run .ci/system.sh)")
    from airflow.dag_processing.dagbag import DagBag

    shots = Path(os.environ.get("BABELQUEUE_TRIGGER_FORM_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    served = api_server["dags"]  # the files the server was given
    control = DagBag(dag_folder=str(served / "trigger_form_control.py")).get_dag("trigger_form_control")
    triage = DagBag(dag_folder=str(served / f"{TRIAGE}.py")).get_dag(TRIAGE)
    defaults = {name: spec["value"] for name, spec in form_params(triage).items()}
    base, db = api_server["base"], api_server["db"]

    with chromium_page(Path(tempfile.mkdtemp(prefix="bq-chromium-", dir=tmp_path)), 1280, 2700) as browser:
        assert trigger_blockers(form_params(control)) == ["note"]
        assert _open_trigger_form(browser, base, "trigger_form_control", "note") is True, (
            "the real form accepted a blank string param: the Python check no longer matches it")
        browser.screenshot(shots / "trigger_form_control.png", DIALOG)

        before = _runs(db, TRIAGE)
        disabled = _open_trigger_form(browser, base, TRIAGE, "babelqueue_conn_id")
        shot = browser.screenshot(shots / f"trigger_form_{TRIAGE}.png", DIALOG)
        assert disabled is False, f"Trigger is disabled in the form with the defaults (see {shot})"
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000, shot

        browser.click(SUBMIT)
        browser.wait_for("location.pathname.includes('/runs/')", "the new run's page after Trigger")
        deadline = time.monotonic() + 30
        while not (new := {k: v for k, v in _runs(db, TRIAGE).items() if k not in before}):
            assert time.monotonic() < deadline, "no dag run was created within 30 s of pressing Trigger"
            time.sleep(0.5)
        [(run_id, run)] = new.items()
        assert run_id.startswith("manual__") and run["run_type"] == "manual", run
        assert run["conf"] == defaults, f"the form sent {run['conf']}, the DAG's defaults are {defaults}"
        assert run["conf"]["output_root"] is None and run["conf"]["dry_run"] is True

        # A list or an object param emptied by hand: the form then holds null for it, which a plain "array" or
        # "object" type counts as missing (Trigger disabled); the sample DAGs' optional lists and spark_conf are
        # nullable, and null means what [] and {} mean.
        before = _runs(db, TRIAGE)
        _open_trigger_form(browser, base, TRIAGE, "babelqueue_conn_id")
        browser.clear("#element_replay_reasons")
        browser.clear_editor("#element_spark_conf")
        disabled = browser.settled(f"document.querySelector('{SUBMIT}').disabled")
        shot = browser.screenshot(shots / f"trigger_form_{TRIAGE}_cleared.png", DIALOG)
        assert disabled is False, f"Trigger is disabled once replay_reasons and spark_conf are emptied (see {shot})"
        browser.click(SUBMIT)
        deadline = time.monotonic() + 30
        while not (new := {k: v for k, v in _runs(db, TRIAGE).items() if k not in before}):
            assert time.monotonic() < deadline, "no dag run was created within 30 s of pressing Trigger"
            time.sleep(0.5)
    [(run_id, run)] = new.items()
    assert run["conf"]["replay_reasons"] in (None, []) and run["conf"]["spark_conf"] in (None, {}), run["conf"]
    emptied = ("replay_reasons", "spark_conf")
    assert {k: v for k, v in run["conf"].items() if k not in emptied} == {
        k: v for k, v in defaults.items() if k not in emptied}
