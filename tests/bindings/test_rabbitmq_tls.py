"""RabbitMQ over TLS (``amqps``) with a user, password, virtual host and CA bundle, all taken from an Airflow
connection: a second, isolated, TLS-only RabbitMQ node with a throwaway CA, on free loopback ports.

The machine's own node (``rabbit@localhost``, 5672/25672) is never touched: the test node has its own name,
ports, Erlang cookie (``$HOME`` is the tmp dir), data, logs and config, and ignores
``/etc/rabbitmq/rabbitmq-env.conf`` (which names the machine's node). The node is a
``tests.nodes.RabbitNode``.
"""

from __future__ import annotations

import json
import shutil
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
from tests.nodes import HOST, RabbitNode

VHOST = "bq-tls"
USER = "bq-tls-user"
PASSWORD = "tls-Rabbit-Secret-4321"


@dataclass(frozen=True)
class Broker:
    node: RabbitNode
    ca: Path

    @property
    def port(self) -> int:
        return self.node.port

    def ctl(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return self.node.ctl(*args, timeout=timeout)

    def raw(self) -> pika.BlockingConnection:
        """An independent pika connection (TLS, trusted CA) to inspect the queues."""
        return _tls_connection(self.node.port, self.ca)


def _tls_connection(port: int, ca: Path) -> pika.BlockingConnection:
    context = ssl.create_default_context(cafile=str(ca))
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            HOST,
            port,
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


def _make_certificates(tmp: Path) -> None:
    """A CA and a server certificate valid for the IP 127.0.0.1 only (not for the name ``localhost``)."""
    _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
         "-days", "2", "-subj", "/CN=babelqueue-test-ca", cwd=tmp)
    _run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
         "-subj", f"/CN={HOST}", cwd=tmp)
    (tmp / "ext.cnf").write_text(f"subjectAltName=IP:{HOST}\n")
    _run("openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "server.crt", "-days", "2", "-extfile", "ext.cnf", cwd=tmp)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed for the RabbitMQ TLS test and is not on PATH")
    tmp = tmp_path_factory.mktemp("rabbitmq-tls")
    _make_certificates(tmp)
    config = [
        "listeners.tcp = none",
        f"listeners.ssl.default = {HOST}:{{port}}",
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
    ]
    # A TLS login with the throwaway CA and user proves the node is ours and its TLS listener is up.
    node = RabbitNode(tmp, config, ready=lambda n: _tls_connection(n.port, tmp / "ca.crt").close())
    try:
        node.start()
        yield Broker(node, tmp / "ca.crt")
    finally:
        node.stop()


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
            "conn_type": "babelqueue+rabbitmq",
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
