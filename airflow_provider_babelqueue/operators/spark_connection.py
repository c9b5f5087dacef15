"""Can spark-submit run with this Spark connection? Answered before a pipeline drains or submits anything.

Without this check a missing ``spark_default`` is not an error at all: the Spark provider falls back to the
``yarn`` master and spark-submit fails minutes later with a Hadoop configuration stack trace, after the drain has
already moved the dead letters out of the broker. :func:`check_spark_connection` reads the connection as the
Spark provider does (the master is its host, with its port when one is set) and fails with an error that names
the connection and says how to define it. It starts no JVM: it only looks for what spark-submit will need (the
binary, Java for a local master, the master's port for a standalone cluster, Hadoop's configuration for YARN).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..core.errors import ConnectionConfigError

__all__ = ["SparkTarget", "check_spark_connection", "how_to_define", "spark_master", "submit_path"]

_LOCAL = re.compile(r"local(\[(\*|\d+)(,\s*\d+)?\])?")
_PORT_TIMEOUT = 3.0


def how_to_define(conn_id: str) -> str:
    """The sentence every error here ends with: the four usual ways to define the connection."""
    variable = "AIRFLOW_CONN_" + re.sub(r"[^A-Za-z0-9]", "_", conn_id).upper()
    return (f"Define connection {conn_id!r} with conn_type 'spark' and the master as its host, e.g. "
            f"{variable}='{{\"conn_type\": \"spark\", \"host\": \"local[*]\"}}' to run on this worker, "
            "host 'spark://<master>' and port 7077 for a standalone cluster, host 'k8s://https://<api server>' "
            "for Kubernetes, or host 'yarn' with HADOOP_CONF_DIR set for YARN (docs/spark.md, 'The Spark "
            "connection').")


@dataclass(frozen=True)
class SparkTarget:
    """What the check found: the master spark-submit will be given and the binary that will run.

    :param conn_id: the Spark connection checked.
    :param master: the master URL as the Spark provider builds it (``local[*]``, ``spark://h:7077``, ...).
    :param binary: the spark-submit executable's full path.
    :param deploy_mode: the connection's ``deploy-mode`` extra (``client``/``cluster``), if it sets one.
    """

    conn_id: str
    master: str
    binary: str
    deploy_mode: str | None = None

    @property
    def is_local(self) -> bool:
        """True for a ``local``/``local[N]`` master (the driver and executors in one JVM on this worker)."""
        return bool(_LOCAL.fullmatch(self.master))


def spark_master(conn_type: str | None, host: str | None, port: int | None) -> str:
    """The master URL the Spark provider builds from a connection.

    A ``spark`` connection whose host holds a URL (``k8s://https://h``, ``spark://h``) or has no port gives its
    host; otherwise the connection type is the scheme (``spark://h``, as a connection URI ``spark://h:7077``
    stores it). A port is appended when set. An empty host gives ``""`` (the provider would fall back to YARN).
    """
    host = (host or "").strip()
    if not host:
        return ""
    kind = conn_type or "spark"
    master = host if kind == "spark" and ("://" in host or not port) else f"{kind}://{host}"
    return f"{master}:{port}" if port else master


def submit_path(env: Mapping[str, str] | None = None) -> str:
    """The PATH spark-submit is looked up on: the task's, with this interpreter's own ``bin`` folder added.

    ``pip install pyspark`` puts ``spark-submit`` beside the venv's ``python``; a worker started by absolute path
    (``/opt/venv/bin/airflow``) may not have that folder on its PATH, so the operator passes this PATH to the
    Spark provider's subprocess.
    """
    path = (env or os.environ).get("PATH", os.defpath)
    own = str(Path(sys.executable).parent)
    return path if own in path.split(os.pathsep) else f"{path}{os.pathsep}{own}"


def _java_found(env: Mapping[str, str]) -> bool:
    home = env.get("JAVA_HOME")
    if home and Path(home, "bin", "java").exists():
        return True
    return shutil.which("java", path=env.get("PATH")) is not None


def _standalone_reachable(master: str) -> str | None:
    """None when at least one master of ``spark://h1:p1[,h2:p2]`` accepts a TCP connection; else why not."""
    problems = []
    for address in master[len("spark://"):].split(","):
        parts = urlsplit(f"spark://{address.strip()}")
        if not parts.hostname:
            problems.append(f"{address!r} names no host")
            continue
        port = parts.port or 7077
        try:
            with socket.create_connection((parts.hostname, port), timeout=_PORT_TIMEOUT):
                return None
        except OSError as exc:
            problems.append(f"{parts.hostname}:{port}: {exc.strerror or exc}")
    return "; ".join(problems)


def _get_connection(conn_id: str) -> Any:
    from airflow.sdk import BaseHook

    try:
        return BaseHook.get_connection(conn_id)
    except Exception as exc:  # noqa: BLE001 - not found, or a secrets backend failing: both stop the task here
        raise ConnectionConfigError(
            f"Spark connection {conn_id!r} is not defined ({type(exc).__name__}: {exc}). Without it the Spark "
            f"provider would submit to YARN and fail there. {how_to_define(conn_id)}"
        ) from None


def check_spark_connection(conn_id: str, env: Mapping[str, str] | None = None, binary: str | None = None
                           ) -> SparkTarget:
    """Fail now, with what to fix, when spark-submit could not run the jobs with connection ``conn_id``.

    :param conn_id: the Spark connection (``spark_default`` in the sample DAGs).
    :param env: the environment spark-submit will get (the operator's ``env_vars`` over the worker's); Java,
        ``HADOOP_CONF_DIR`` and the binary are looked for in it. Default: this process's.
    :param binary: the operator's own ``spark_binary``, which wins over the connection's ``spark-binary`` extra.
    :raises ConnectionConfigError: the connection is missing, names no master or an unknown kind of master, or
        what that master needs is not there (with the fix in the message).
    """
    environment = dict(os.environ if env is None else env)
    environment["PATH"] = submit_path(environment)
    connection = _get_connection(conn_id)
    master = spark_master(connection.conn_type, connection.host, connection.port)
    if not master:
        raise ConnectionConfigError(f"Spark connection {conn_id!r} has no host, so the Spark provider would "
                                    f"submit to YARN. {how_to_define(conn_id)}")
    extra = connection.extra_dejson or {}
    binary_name = str(binary or extra.get("spark-binary") or "spark-submit")
    found = shutil.which(binary_name, path=environment["PATH"])
    if found is None:
        raise ConnectionConfigError(
            f"{binary_name!r} (the spark-submit of Spark connection {conn_id!r}) was not found on this worker's "
            f"PATH ({environment['PATH']}). Install the provider with its spark extra "
            "(pip install 'airflow-provider-babelqueue[spark]', which brings pyspark and its spark-submit) or "
            "set the connection's extra 'spark-binary' to a spark-submit on the worker.")
    target = SparkTarget(conn_id, master, found, extra.get("deploy-mode"))
    if target.is_local:
        if not _java_found(environment):
            raise ConnectionConfigError(
                f"Spark connection {conn_id!r} runs Spark on this worker ({master}), which needs Java 17 or 21: "
                "no JAVA_HOME and no 'java' on PATH. Install a JDK on the worker (e.g. Debian's openjdk-17-jre-"
                "headless) or set JAVA_HOME in the operator's env_vars.")
    elif master.startswith("spark://"):
        problem = _standalone_reachable(master)
        if problem:
            raise ConnectionConfigError(
                f"the Spark master of connection {conn_id!r} ({master}) does not answer: {problem}. Start the "
                f"standalone master, or fix the connection's host and port. {how_to_define(conn_id)}")
    elif master == "yarn" or master.startswith("yarn"):
        if not (environment.get("HADOOP_CONF_DIR") or environment.get("YARN_CONF_DIR")):
            raise ConnectionConfigError(
                f"Spark connection {conn_id!r} submits to YARN, which needs HADOOP_CONF_DIR or YARN_CONF_DIR on "
                "the worker (or in the operator's env_vars) pointing at the cluster's configuration. If YARN was "
                f"not meant: {how_to_define(conn_id)}")
    elif not master.startswith(("k8s://", "mesos://")):
        raise ConnectionConfigError(
            f"Spark connection {conn_id!r} names master {master!r}, which spark-submit does not know. "
            f"{how_to_define(conn_id)}")
    return target
