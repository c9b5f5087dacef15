"""Throwaway broker servers for tests that must stop, kill or reconfigure one: Redis and RabbitMQ.

The machine's own servers (Redis 6379, RabbitMQ ``rabbit@localhost`` on 5672/25672) are never touched. A node
here has its own ports, data directory and logs under a tmp dir, and can be stopped and started again on the
same data, which is what the outage tests need (Redis with an fsync-always AOF, RabbitMQ with its Mnesia dir).

RabbitMQ notes: the scripts are run from ``/usr/lib/rabbitmq/bin`` (the ``/usr/sbin`` wrappers switch to the
``rabbitmq`` user and its home); ``HOME`` is the tmp dir so the node and ``rabbitmqctl`` share a private Erlang
cookie; ``/etc/rabbitmq/rabbitmq-env.conf`` (which names the machine's node) is replaced by an empty file.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

__all__ = ["HOST", "RMQ_BIN", "RabbitNode", "RedisNode", "free_ports"]

HOST = "127.0.0.1"
RMQ_BIN = Path("/usr/lib/rabbitmq/bin")
#: Ports the machine's RabbitMQ node and the rabbitmqctl CLI may use (its distribution range is 35672-35682).
RESERVED = {4369, 5671, 5672, 6379, 15672, 25672, *range(35672, 35693)}


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports, none of them one the machine's brokers or their CLIs may use."""
    while True:
        sockets = [socket.socket() for _ in range(count)]
        try:
            for sock in sockets:
                sock.bind((HOST, 0))
            ports = [sock.getsockname()[1] for sock in sockets]
        finally:
            for sock in sockets:
                sock.close()
        if not RESERVED.intersection(ports):
            return ports


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


class RedisNode:
    """A redis-server on a free port whose data survives a kill: an AOF fsynced on every write.

    :param extra_args: more ``redis-server`` arguments (TLS settings, say).
    """

    def __init__(self, base: Path, extra_args: Sequence[str] = ()) -> None:
        self.dir = base
        self.port = free_ports(1)[0]
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self, timeout: float = 15.0) -> None:
        import redis

        log = self.dir / "redis.out"
        with log.open("ab") as sink:
            self.process = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", HOST, "--dir", str(self.dir),
                 "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
                 *self.extra_args],
                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                pytest.fail(f"redis-server on {self.port} exited with {self.process.returncode}:\n{_tail(log)}")
            try:
                client = redis.Redis(host=HOST, port=self.port, socket_timeout=1)
                client.ping()
                client.close()
                return
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    pytest.fail(f"redis-server on {self.port} did not answer within {timeout:.0f} s:\n{_tail(log)}")
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: an outage with no goodbye. Acknowledged writes are on disk (AOF, fsync always)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    stop = kill


class RabbitNode:
    """An isolated RabbitMQ node on free loopback ports that can be stopped and started again on its data.

    :param config: ``rabbitmq.conf`` lines; ``{port}`` in them is replaced by the node's AMQP port. The default
        is a plain TCP listener with ``guest`` allowed from loopback.
    :param ready: a callable that proves the node is ours and serving (it must raise until then); default a
        plain AMQP login as guest.
    """

    START_TIMEOUT = 90.0

    def __init__(self, base: Path, config: Sequence[str] | None = None,
                 ready: Callable[[RabbitNode], None] | None = None) -> None:
        for tool in ("rabbitmq-server", "rabbitmqctl"):
            if not os.access(RMQ_BIN / tool, os.X_OK):
                pytest.fail(f"{RMQ_BIN / tool} is needed (Debian package rabbitmq-server)")
        self.dir = base
        self.port, node_port, dist_port = free_ports(3)
        self.node = f"bqtest{uuid.uuid4().hex[:10]}@localhost"
        lines = config if config is not None else [f"listeners.tcp.default = {HOST}:{{port}}", "loopback_users = none"]
        (base / "rabbitmq.conf").write_text("\n".join(line.replace("{port}", str(self.port)) for line in lines) + "\n")
        (base / "enabled_plugins").write_text("[].\n")
        (base / "rabbitmq-env.conf").write_text("")
        cookie = base / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16))
        cookie.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=str(base),
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_PORT=str(node_port),
            RABBITMQ_DIST_PORT=str(dist_port),
            RABBITMQ_CONF_ENV_FILE=str(base / "rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=str(base / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(base / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
            RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
            RABBITMQ_LOG_BASE=str(base / "log"),
            RABBITMQ_PID_FILE=str(base / "node.pid"),
            ERL_EPMD_ADDRESS=HOST,
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
        )
        self.env = env
        self.ready = ready or _plain_login
        self.process: subprocess.Popen[bytes] | None = None

    def ctl(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(RMQ_BIN / "rabbitmqctl"), "-n", self.node, *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def errors(self) -> str:
        """The node's first logged errors (the cause is in its log file, not its stdout), else its output."""
        found: list[str] = []
        for path in (self.dir / "log" / f"{self.node}.log", self.dir / "server.out"):
            try:
                found += [line[:400] for line in path.read_text(errors="replace").splitlines() if "[error]" in line]
            except OSError:
                pass
        return "\n".join(found[:6]) or _tail(self.dir / "server.out")

    def start(self) -> None:
        with (self.dir / "server.out").open("ab") as sink:
            self.process = subprocess.Popen([str(RMQ_BIN / "rabbitmq-server")], cwd=self.dir, env=self.env,
                                            stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + self.START_TIMEOUT
        while True:  # await_startup fails at once until the node has registered with epmd
            if self.process.poll() is not None:
                pytest.fail(f"the test RabbitMQ node {self.node} exited with {self.process.returncode} while "
                            f"starting:\n{self.errors()}")
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"the test RabbitMQ node {self.node} was not up within {self.START_TIMEOUT:.0f} s:\n"
                            f"{self.errors()}")
            try:
                waited = self.ctl("await_startup", "--timeout", str(max(1, int(left))), timeout=left + 10)
            except subprocess.TimeoutExpired:
                continue
            if waited.returncode == 0:
                break
            time.sleep(0.5)
        # Booted is not enough: a listener that failed (port taken meanwhile) is only logged, and a plain
        # connect could reach another server. A login proves it is ours.
        ready_by = time.monotonic() + 15
        while True:
            try:
                self.ready(self)
                return
            except Exception as exc:  # noqa: BLE001 - any failure means not ready yet
                if time.monotonic() > ready_by:
                    pytest.fail(f"the test RabbitMQ node {self.node} started but no login on {HOST}:{self.port} "
                                f"succeeded ({exc!r}):\n{self.errors()}")
                time.sleep(0.2)

    def stop(self) -> None:
        """Stop the node; kill its process group (beam, erl_child_setup) if it does not go by itself."""
        server = self.process
        if server is None:
            return
        if server.poll() is None:
            try:
                self.ctl("stop", timeout=60)
            except subprocess.TimeoutExpired:
                pass
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self) -> None:
        """SIGKILL the node's whole process group: an outage with no goodbye."""
        server = self.process
        if server is None:
            return
        try:
            os.killpg(server.pid, signal.SIGKILL)  # our own session: rabbitmq-server ran with start_new_session
        except ProcessLookupError:
            pass
        server.wait(timeout=10)
        self.process = None


def _plain_login(node: RabbitNode) -> None:
    import pika

    pika.BlockingConnection(pika.ConnectionParameters(HOST, node.port, connection_attempts=1, socket_timeout=3,
                                                      stack_timeout=5)).close()
