"""RabbitMQ over TLS (``amqps``) with a user, password, virtual host and CA bundle, all taken from an Airflow
connection: a second, isolated, TLS-only RabbitMQ node with a throwaway CA, on free loopback ports.

The machine's own node (``rabbit@localhost``, 5672/25672) is never touched: the test node has its own name,
ports, Erlang cookie (``$HOME`` is the tmp dir), data, logs and config, and ignores
``/etc/rabbitmq/rabbitmq-env.conf`` (which names the machine's node). The scripts are run from
``/usr/lib/rabbitmq/bin``: the ``/usr/sbin`` wrappers switch to the ``rabbitmq`` user and its home.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import BindingError
from airflow_provider_babelqueue.bindings.rabbitmq import RabbitMQBinding, RabbitMQConfig
from airflow_provider_babelqueue.hooks import get_hook

RMQ_BIN = Path("/usr/lib/rabbitmq/bin")
HOST = "127.0.0.1"
VHOST = "bq-tls"
USER = "bq-tls-user"
PASSWORD = "tls-Rabbit-Secret-4321"
START_TIMEOUT = 90.0
#: Ports the machine's node and the rabbitmqctl CLI use (its distribution range is 35672-35682).
RESERVED = {4369, 5671, 5672, 15672, 25672, *range(35672, 35693)}


@dataclass(frozen=True)
class Broker:
    node: str
    port: int
    ca: Path
    env: dict[str, str]

    def ctl(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(RMQ_BIN / "rabbitmqctl"), "-n", self.node, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def raw(self) -> pika.BlockingConnection:
        """An independent pika connection (TLS, trusted CA) to inspect the queues."""
        context = ssl.create_default_context(cafile=str(self.ca))
        return pika.BlockingConnection(
            pika.ConnectionParameters(
                HOST,
                self.port,
                VHOST,
                pika.PlainCredentials(USER, PASSWORD),
                ssl_options=pika.SSLOptions(context, HOST),
                connection_attempts=1,
                socket_timeout=3,
                stack_timeout=5,
            )
        )


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(args, cwd=cwd, check=True, capture_output=True)


def _free_ports(count: int) -> list[int]:
    """Distinct free loopback ports, none of them one the machine's RabbitMQ or its CLI may use."""
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


def _make_certificates(tmp: Path) -> None:
    """A CA and a server certificate valid for the IP 127.0.0.1 only (not for the name ``localhost``)."""
    _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
         "-days", "2", "-subj", "/CN=babelqueue-test-ca", cwd=tmp)
    _run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
         "-subj", f"/CN={HOST}", cwd=tmp)
    (tmp / "ext.cnf").write_text(f"subjectAltName=IP:{HOST}\n")
    _run("openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "server.crt", "-days", "2", "-extfile", "ext.cnf", cwd=tmp)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def _errors(tmp: Path, node: str) -> str:
    """The node's first logged errors (the cause; its log file has them, its stdout not), else its output's end."""
    errors: list[str] = []
    for path in (tmp / "log" / f"{node}.log", tmp / "server.out"):
        try:
            errors += [line[:400] for line in path.read_text(errors="replace").splitlines() if "[error]" in line]
        except OSError:
            pass
    return "\n".join(errors[:6]) or _tail(tmp / "server.out")


def _stop(broker: Broker, server: subprocess.Popen[bytes]) -> None:
    """Stop the test node; kill its process group (beam, erl_child_setup) if it does not go by itself."""
    if server.poll() is None:
        try:
            broker.ctl("stop", timeout=60)
        except subprocess.TimeoutExpired:
            pass
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(server.pid, signal.SIGKILL)  # our own session: rabbitmq-server ran with start_new_session
    except ProcessLookupError:
        pass
    server.wait(timeout=10)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed for the RabbitMQ TLS test and is not on PATH")
    for tool in ("rabbitmq-server", "rabbitmqctl"):
        if not os.access(RMQ_BIN / tool, os.X_OK):
            pytest.fail(f"{RMQ_BIN / tool} is needed for the RabbitMQ TLS test (Debian package rabbitmq-server)")
    tmp = tmp_path_factory.mktemp("rabbitmq-tls")
    _make_certificates(tmp)
    tls_port, node_port, dist_port = _free_ports(3)
    node = f"bqtls{uuid.uuid4().hex[:10]}@localhost"
    (tmp / "rabbitmq.conf").write_text(
        "\n".join(
            [
                "listeners.tcp = none",
                f"listeners.ssl.default = {HOST}:{tls_port}",
                f"ssl_options.cacertfile = {tmp / 'ca.crt'}",
                f"ssl_options.certfile = {tmp / 'server.crt'}",
                f"ssl_options.keyfile = {tmp / 'server.key'}",
                "ssl_options.verify = verify_none",
                "ssl_options.fail_if_no_peer_cert = false",
                "loopback_users = none",
                f"default_vhost = {VHOST}",
                f"default_user = {USER}",
                f"default_pass = {PASSWORD}",
                "default_permissions.configure = .*",
                "default_permissions.read = .*",
                "default_permissions.write = .*",
                "",
            ]
        )
    )
    (tmp / "enabled_plugins").write_text("[].\n")
    (tmp / "rabbitmq-env.conf").write_text("")  # instead of /etc/rabbitmq/rabbitmq-env.conf
    cookie = tmp / ".erlang.cookie"  # shared by the node and rabbitmqctl through HOME
    cookie.write_text(secrets.token_hex(16))
    cookie.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
    env.update(
        HOME=str(tmp),
        RABBITMQ_NODENAME=node,
        RABBITMQ_NODE_PORT=str(node_port),
        RABBITMQ_DIST_PORT=str(dist_port),
        RABBITMQ_CONF_ENV_FILE=str(tmp / "rabbitmq-env.conf"),
        RABBITMQ_CONFIG_FILE=str(tmp / "rabbitmq.conf"),
        RABBITMQ_ADVANCED_CONFIG_FILE=str(tmp / "advanced.config"),
        RABBITMQ_ENABLED_PLUGINS_FILE=str(tmp / "enabled_plugins"),
        RABBITMQ_MNESIA_BASE=str(tmp / "mnesia"),
        RABBITMQ_LOG_BASE=str(tmp / "log"),
        RABBITMQ_PID_FILE=str(tmp / "node.pid"),
        ERL_EPMD_ADDRESS=HOST,
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
    )
    result = Broker(node, tls_port, tmp / "ca.crt", env)
    output = tmp / "server.out"
    with output.open("wb") as sink:
        server = subprocess.Popen(
            [str(RMQ_BIN / "rabbitmq-server")],
            cwd=tmp,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:  # await_startup fails at once until the node has registered with epmd
            if server.poll() is not None:
                pytest.fail(f"the test RabbitMQ node {node} exited with {server.returncode} while starting:\n"
                            f"{_errors(tmp, node)}")
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"the test RabbitMQ node {node} was not up within {START_TIMEOUT:.0f} s:\n"
                            f"{_errors(tmp, node)}")
            try:
                waited = result.ctl("await_startup", "--timeout", str(max(1, int(left))), timeout=left + 10)
            except subprocess.TimeoutExpired:
                continue
            if waited.returncode == 0:
                break
            time.sleep(0.5)
        # Booted is not enough: a listener that failed (port taken meanwhile) is only logged, and a plain
        # connect could reach another server. A TLS login with the throwaway CA and user proves it is ours.
        ready_by = time.monotonic() + 15
        while True:
            try:
                result.raw().close()
                break
            except (pika.exceptions.AMQPError, OSError) as exc:
                if time.monotonic() > ready_by:
                    pytest.fail(f"the test RabbitMQ node {node} started but no TLS login on {HOST}:{tls_port} "
                                f"succeeded ({exc!r}):\n{_errors(tmp, node)}")
                time.sleep(0.2)
        yield result
    finally:
        _stop(result, server)


def _binding(broker: Broker, **options: Any) -> RabbitMQBinding:
    settings: dict[str, Any] = {"host": HOST, "port": broker.port, "virtual_host": VHOST, "username": USER,
                                "password": PASSWORD, "socket_timeout": 3.0, **options}
    return RabbitMQBinding(RabbitMQConfig(**settings))


def _ready(broker: Broker, queue: str) -> int:
    with broker.raw() as conn:
        return conn.channel().queue_declare(queue, passive=True).method.message_count


@pytest.mark.parametrize("form", ["json", "uri"])
def test_hook_reaches_rabbitmq_over_tls_with_every_connection_setting(
    monkeypatch: pytest.MonkeyPatch, broker: Broker, form: str
) -> None:
    if form == "json":
        spec = json.dumps({
            "conn_type": "babelqueue_rabbitmq",
            "host": HOST,
            "port": broker.port,
            "schema": VHOST,
            "login": USER,
            "password": PASSWORD,
            "extra": {"ssl": "true", "ssl_ca_certs": str(broker.ca), "heartbeat": 30},
        })
    else:
        spec = (f"babelqueue-rabbitmq://{quote(USER)}:{quote(PASSWORD)}@{HOST}:{broker.port}/{VHOST}"
                f"?ssl=true&ssl_ca_certs={quote(str(broker.ca), safe='')}&heartbeat=30")
    monkeypatch.setenv("AIRFLOW_CONN_BQ_RMQ_TLS", spec)
    hook = get_hook("bq_rmq_tls")
    assert hook.test_connection() == (True, f"Connected to BabelQueue RabbitMQ at {HOST}:{broker.port}")
    binding = hook.get_binding()
    assert isinstance(binding, RabbitMQBinding)
    config = binding.config
    assert (config.host, config.port, config.virtual_host, config.username, config.password) == (
        HOST, broker.port, VHOST, USER, PASSWORD)
    assert config.ssl is True and config.ssl_ca_certs == str(broker.ca) and config.heartbeat == 30
    queue = f"tls-{uuid.uuid4().hex[:10]}"
    try:
        body = bq.encode(bq.make_envelope("urn:babel:orders:created", {"tls": True, "form": form}, queue_name=queue))
        binding.publish(body, queue)
        assert _ready(broker, queue) == 1
        # the broker itself says the binding's connection is TLS (its only listener is TLS anyway)
        listed = broker.ctl("list_connections", "user", "vhost", "ssl", "--silent").stdout.split("\n")
        assert f"{USER}\t{VHOST}\ttrue" in [line.strip() for line in listed], listed
        message = binding.reserve(queue, timeout=2)
        assert message is not None and message.body == body
        assert message.envelope is not None and bq.data_of(message.envelope) == {"tls": True, "form": form}
        binding.ack(message)
        assert _ready(broker, queue) == 0
        assert binding.reserve(queue, timeout=0) is None
    finally:
        hook.close()
        with broker.raw() as conn:
            conn.channel().queue_delete(queue)


def test_amqps_url_reaches_rabbitmq_over_tls(broker: Broker) -> None:
    url = (f"amqps://{quote(USER)}:{quote(PASSWORD)}@{HOST}:{broker.port}/{VHOST}"
           f"?ssl_ca_certs={quote(str(broker.ca), safe='')}&socket_timeout=3")
    binding = RabbitMQBinding(RabbitMQConfig.from_url(url))
    assert binding.config.ssl is True
    try:
        binding.ping()
        assert binding.depth(f"tls-missing-{uuid.uuid4().hex[:8]}") == 0
    finally:
        binding.close()


def test_plain_connection_to_a_tls_port_fails_clearly(broker: Broker) -> None:
    binding = _binding(broker)
    started = time.monotonic()
    with pytest.raises(BindingError, match=f"{HOST}:{broker.port}.*TLS is off") as info:
        binding.ping()
    assert time.monotonic() - started < 15
    assert PASSWORD not in str(info.value)
    binding.close()


def test_untrusted_certificate_is_refused(broker: Broker) -> None:
    binding = _binding(broker, ssl=True)  # the system CA store does not hold the throwaway CA
    with pytest.raises(BindingError, match=f"{HOST}:{broker.port}") as info:
        binding.ping()
    text = str(info.value)
    assert "CERTIFICATE_VERIFY_FAILED" in text and "TLS is on" in text, text
    assert PASSWORD not in text
    binding.close()


def test_certificate_for_another_host_name_is_refused(broker: Broker) -> None:
    """The certificate is for the IP 127.0.0.1 only: reaching the same server as ``localhost`` must fail."""
    binding = _binding(broker, host="localhost", ssl=True, ssl_ca_certs=str(broker.ca))
    with pytest.raises(BindingError, match=f"localhost:{broker.port}") as info:
        binding.ping()
    text = str(info.value)
    assert "CERTIFICATE_VERIFY_FAILED" in text and "localhost" in text.split("CERTIFICATE_VERIFY_FAILED")[1], text
    assert PASSWORD not in text
    binding.close()


def test_wrong_password_over_tls_fails_without_printing_it(broker: Broker) -> None:
    wrong = f"not-{PASSWORD}"
    binding = _binding(broker, password=wrong, ssl=True, ssl_ca_certs=str(broker.ca))
    with pytest.raises(BindingError, match=f"{HOST}:{broker.port}.*authentication failed") as info:
        binding.ping()
    assert wrong not in str(info.value) and PASSWORD not in str(info.value)
    binding.close()


def test_tls_settings_that_cannot_work_are_refused_with_the_setting_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ssl_ca_certs is set but ssl is off"):
        RabbitMQConfig(ssl_ca_certs=str(tmp_path))
    binding = RabbitMQBinding(RabbitMQConfig(ssl=True, ssl_ca_certs="/nonexistent/ca.pem"))
    with pytest.raises(BindingError, match=r"ssl_ca_certs '/nonexistent/ca.pem' is not a readable file"):
        binding.ping()
