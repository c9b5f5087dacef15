"""A Spark standalone cluster on loopback, started from the installed pyspark: one master and one worker.

The tests that submit to it prove that the jobs run where a production deployment runs them: tasks on an
executor that a worker started in its own JVM, reading and writing through paths both sides can reach, with the
driver here in the client process. Nothing is installed for it: the pip wheel of pyspark ships every jar a master
and a worker need, though not the ``sbin/start-*.sh`` scripts, so both daemons start as plain ``java`` commands
(what those scripts end up running). Each daemon is the leader of its own process group, and the executors the
worker launches join the worker's group: stopping the two groups stops everything the cluster started.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["StandaloneCluster", "free_port", "scala_version", "spark_home", "standalone_cluster"]

HOST = "127.0.0.1"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
#: JVM options of the two daemons: they only keep a registry and launch executors, so a small heap, the serial
#: collector and the quick compiler alone (C1) are enough.
DAEMON_JAVA_OPTIONS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


def spark_home() -> Path | None:
    """The installed pyspark package folder, which is a complete ``SPARK_HOME`` (``jars/``, ``bin/``); ``None``
    when pyspark is not installed."""
    try:
        import pyspark
    except ImportError:
        return None
    home = Path(pyspark.__file__).resolve().parent
    return home if (home / "jars").is_dir() else None


def scala_version(home: Path) -> str:
    """The Scala version the installed Spark was built for (``2.13``), from its core jar's name."""
    (core,) = home.glob("jars/spark-core_*.jar")
    return core.name.removeprefix("spark-core_").split("-", 1)[0]


def free_port() -> int:
    """A loopback TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - a loopback http:// URL of ours
        return json.loads(response.read())


def _tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"({path}: {exc})"
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class StandaloneCluster:
    """A running master and worker. ``master_url`` is what a Spark connection's host points at."""

    port: int
    web_ui_port: int
    work_dir: Path
    log_dir: Path

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    def state(self) -> dict[str, Any]:
        """The master's own view (its web UI's JSON): workers, running and completed applications."""
        state: dict[str, Any] = _get_json(f"http://{HOST}:{self.web_ui_port}/json/")
        return state

    def completed_apps(self) -> dict[str, dict[str, Any]]:
        """The applications the master saw finish, by name (the last one of each name)."""
        return {app["name"]: app for app in self.state()["completedapps"]}

    def executor_logs(self, app_id: str) -> dict[str, str]:
        """Each executor's stderr (its task log) for one application, by executor id, from the worker's work
        directory: the worker writes it there because it launched that executor."""
        folder = self.work_dir / app_id
        if not folder.is_dir():
            return {}
        return {path.parent.name: path.read_text(encoding="utf-8", errors="replace")
                for path in sorted(folder.glob("*/stderr"))}

    def logs(self) -> str:
        """The tails of the master's, the worker's and every executor's log, for a failure message (the whole
        files stay in ``log_dir`` and ``work_dir``)."""
        paths = [self.log_dir / "master.log", self.log_dir / "worker.log", *sorted(self.work_dir.glob("*/*/stderr"))]
        return "\n".join(f"--- {path} ---\n{_tail(path)}" for path in paths)


def _die_with_parent() -> None:
    """In the daemon's child process, before ``exec``: ask Linux for a SIGTERM when the process that started it
    dies, so that a test run killed outright (where no clean-up code runs) leaves no daemon behind. A worker
    that gets SIGTERM kills its executors itself."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _stop(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM to the daemon's whole process group (its executors included), SIGKILL after ``grace`` seconds."""
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _stop_all(processes: dict[str, subprocess.Popen[bytes]]) -> None:
    """Stop the daemons in reverse order of their start: the worker (and its executors) first, then the master."""
    for process in reversed(list(processes.values())):
        _stop(process)


def _wait_for(check: Any, what: str, processes: dict[str, subprocess.Popen[bytes]], timeout: float,
              logs: Any) -> None:
    """Poll ``check()`` until it is true; fail with the daemons' logs if a daemon exits or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            pass  # the web UI is not up yet
        dead = [f"{name} exited with {process.returncode}" for name, process in processes.items()
                if process.poll() is not None]
        if dead or time.monotonic() > deadline:
            reason = ", ".join(dead) if dead else f"not ready after {timeout:.0f} s"
            raise RuntimeError(f"Spark standalone cluster: {what}: {reason}\n{logs()}")
        time.sleep(0.25)


@contextmanager
def standalone_cluster(root: Path, *, cores: int = 1, memory: str = "1g",
                       timeout: float = 120.0) -> Iterator[StandaloneCluster]:
    """Start a master and one worker on free loopback ports under ``root`` (logs, the worker's work and local
    directories), wait until the worker is registered and alive, yield the cluster, and stop both daemons'
    process groups on the way out, whatever happened inside.

    :param root: a fresh folder; the logs stay there after the cluster stops.
    :param cores: the worker's cores (an application takes them all unless it asks for fewer).
    :param memory: the memory the worker offers to executors.
    :param timeout: seconds to wait for each daemon to come up.
    """
    home = spark_home()
    java = shutil.which("java")
    if home is None or java is None:
        raise RuntimeError("a standalone cluster needs pyspark (with its jars) and java")
    log_dir, work_dir, local_dir = root / "logs", root / "work", root / "local"
    for folder in (log_dir, work_dir, local_dir):
        folder.mkdir(parents=True, exist_ok=True)
    port, web_ui, worker_web_ui = free_port(), free_port(), free_port()
    cluster = StandaloneCluster(port=port, web_ui_port=web_ui, work_dir=work_dir, log_dir=log_dir)
    # The worker builds each executor's command with Spark's launcher library, which needs the Scala version
    # that bin/load-spark-env.sh would export (it looks for a source build's folders otherwise).
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_SCALA_VERSION": scala_version(home),
           "SPARK_LOCAL_IP": HOST, "SPARK_LOCAL_DIRS": str(local_dir)}
    classpath = f"{home / 'jars'}/*"
    processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, main_class: str, properties: list[str], *args: str) -> None:
        with (log_dir / f"{name}.log").open("wb") as log:
            processes[name] = subprocess.Popen(
                [java, *DAEMON_JAVA_OPTIONS, *properties, "-cp", classpath, main_class, *args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root,
                start_new_session=True,  # its own process group, which the executors it starts join
                preexec_fn=_die_with_parent)

    try:
        # no REST submission server: it would claim the fixed port 6066, and client mode does not use it
        start("master", "org.apache.spark.deploy.master.Master", ["-Dspark.master.rest.enabled=false"],
              "--host", HOST, "--port", str(port), "--webui-port", str(web_ui))
        _wait_for(lambda: cluster.state()["status"] == "ALIVE", "master", processes, timeout, cluster.logs)
        start("worker", "org.apache.spark.deploy.worker.Worker", [],
              "--host", HOST, "--cores", str(cores), "--memory", memory, "--webui-port", str(worker_web_ui),
              "--work-dir", str(work_dir), cluster.master_url)
        _wait_for(lambda: any(worker["state"] == "ALIVE" for worker in cluster.state()["workers"]),
                  "worker registration", processes, timeout, cluster.logs)
        yield cluster
    finally:
        _stop_all(processes)
