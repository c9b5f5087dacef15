"""A real local Airflow for end-to-end tests: api-server, scheduler, dag-processor and triggerer on loopback.

``LocalAirflow(tmp_path, dags={...}, env={...})`` writes the DAG files, migrates a fresh metadata DB and starts the
four components (the api-server first, healthy before the others: tasks report to it). ``kill`` sends SIGKILL to
one component's whole process group (a triggerer's supervisor and its runner die together, as on a lost node) and
``start`` brings it back. ``tails()`` gives each log's end for failure messages; ``stop()`` ends everything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


class LocalAirflow:
    """One Airflow home and its running components.

    :param tmp_path: where the home, the DAG folder and the logs go.
    :param dags: DAG file name → source (dedented).
    :param env: extra environment (``AIRFLOW_CONN_*``, settings), on top of fast loopback defaults.
    """

    def __init__(self, tmp_path: Path, dags: dict[str, str], env: dict[str, str] | None = None) -> None:
        self.home = tmp_path / "airflow"
        (self.home / "dags").mkdir(parents=True)
        for name, source in dags.items():
            (self.home / "dags" / name).write_text(textwrap.dedent(source))
        self.port = free_port()
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.home / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.port}/execution/",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
            "AIRFLOW__API__SECRET_KEY": uuid.uuid4().hex,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            **(env or {}),
        }
        self.logs = {name: tmp_path / f"{name}.log" for name in COMPONENTS}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._airflow = str(Path(sys.executable).parent / "airflow")

    def __enter__(self) -> LocalAirflow:
        subprocess.run([self._airflow, "db", "migrate"], env=self.env, check=True, capture_output=True, timeout=600)
        for name in COMPONENTS:
            self.start(name)
            if name == "api-server":
                self._wait_until_healthy()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, name: str) -> None:
        """Start (or restart) one component, appending to its log."""
        command = [self._airflow, name] + (["--port", str(self.port), "--host", "127.0.0.1"]
                                           if name == "api-server" else [])
        self.processes[name] = subprocess.Popen(command, env=self.env, stdout=self.logs[name].open("ab"),
                                                stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self, name: str) -> None:
        """SIGKILL one component and every process it started; returns once they are gone."""
        process = self.processes[name]
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=30)

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            assert process.poll() is None, f"{name} exited: {self.logs[name].read_text()[-3000:]}"

    def tails(self, size: int = 2500) -> str:
        return "\n".join(f"--- {name}\n{path.read_text()[-size:]}" for name, path in self.logs.items())

    def stop(self) -> None:
        for process in self.processes.values():
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)

    def _wait_until_healthy(self) -> None:
        process, log = self.processes["api-server"], self.logs["api-server"]
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert process.poll() is None, f"api-server exited: {log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v2/monitor/health",
                                            timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        pytest.fail(f"the api-server did not answer within 180 s: {log.read_text()[-3000:]}")


def connection_env(conn_id: str, spec: dict[str, Any]) -> dict[str, str]:
    """``AIRFLOW_CONN_<ID>`` for a connection given as Airflow's JSON form."""
    return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(spec)}
