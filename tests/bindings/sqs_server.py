"""A real SQS endpoint for tests: moto's HTTP server in a subprocess (real HTTP, real boto3, no AWS).

:func:`moto_endpoint` starts one server per test process on first use and stops it at interpreter exit,
so every SQS test module shares it. :func:`moto_server` is the context-manager form for a private server.
Dummy credentials and ``us-east-1`` are put in the environment (setdefault) so boto3 never looks further.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from tests.conftest import free_port

__all__ = ["REGION", "delete_queues_except", "free_port", "moto_endpoint", "moto_server", "queue_urls", "sqs_client"]

REGION = "us-east-1"
_DUMMY = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}
_lock = threading.Lock()
_shared: tuple[subprocess.Popen[bytes], str] | None = None
_logs: dict[int, IO[bytes]] = {}


def _use_dummy_credentials() -> None:
    for key, value in _DUMMY.items():
        os.environ.setdefault(key, value)


def _start(startup_timeout: float = 30.0) -> tuple[subprocess.Popen[bytes], str]:
    _use_dummy_credentials()
    executable = Path(sys.executable).with_name("moto_server")  # the venv's, next to its python
    if not executable.exists():
        executable = Path(shutil.which("moto_server") or "moto_server")
    port = free_port()
    # The server logs every request to stderr: a pipe nobody reads would fill up and freeze it, so the
    # log goes to an unlinked temporary file, read only to explain a failed start.
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(
        [str(executable), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=log
    )
    _logs[process.pid] = log
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"moto_server exited with {process.returncode}: {log.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
                return process, endpoint
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    _stop(process)
    raise RuntimeError(f"moto_server did not answer on {endpoint} within {startup_timeout} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    log = _logs.pop(process.pid, None)
    if log is not None:
        log.close()


@contextmanager
def moto_server() -> Iterator[str]:
    """A private moto server for the ``with`` block; yields its endpoint URL."""
    process, endpoint = _start()
    try:
        yield endpoint
    finally:
        _stop(process)


def moto_endpoint() -> str:
    """The endpoint of this process's shared moto server, started on first call, stopped at exit.

    ``BABELQUEUE_TEST_SQS_ENDPOINT`` points the tests at a server started elsewhere instead."""
    global _shared
    if os.environ.get("BABELQUEUE_TEST_SQS_ENDPOINT"):
        _use_dummy_credentials()
        return os.environ["BABELQUEUE_TEST_SQS_ENDPOINT"]
    with _lock:
        if _shared is None or _shared[0].poll() is not None:
            _shared = _start()
            atexit.register(_stop, _shared[0])
        return _shared[1]


def sqs_client(endpoint: str | None = None):  # type: ignore[no-untyped-def]
    """A plain boto3 SQS client on the (shared) moto server, for inspecting what a binding did."""
    import boto3

    _use_dummy_credentials()
    return boto3.client(
        "sqs",
        region_name=REGION,
        endpoint_url=endpoint or moto_endpoint(),
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def queue_urls(client) -> set[str]:  # type: ignore[no-untyped-def]
    """Every queue URL on the server (ListQueues, all pages)."""
    urls: set[str] = set()
    kwargs: dict[str, object] = {"MaxResults": 1000}
    while True:
        page = client.list_queues(**kwargs)
        urls.update(page.get("QueueUrls", []))
        if not page.get("NextToken"):
            return urls
        kwargs["NextToken"] = page["NextToken"]


def delete_queues_except(client, keep: set[str]) -> None:  # type: ignore[no-untyped-def]
    """Delete every queue not in ``keep`` (a snapshot taken before a test), ignoring ones already gone."""
    for url in queue_urls(client) - keep:
        try:
            client.delete_queue(QueueUrl=url)
        except client.exceptions.QueueDoesNotExist:
            pass
