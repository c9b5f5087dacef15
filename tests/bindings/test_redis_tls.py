"""Redis over TLS (``rediss``) with a password, db number and key prefix, all taken from an Airflow
connection: a real TLS-only redis-server with a throwaway CA, on a free loopback port."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import BindingError
from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig
from airflow_provider_babelqueue.hooks import get_hook
from tests.conftest import free_port

PASSWORD = "tls-Secret-9876"


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(args, cwd=cwd, check=True, capture_output=True)




@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    for tool in ("openssl", "redis-server"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is needed for the Redis TLS test and is not on PATH")
    tmp = tmp_path_factory.mktemp("redis-tls")
    _run(
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=babelqueue-test-ca",
        cwd=tmp,
    )
    _run(
        "openssl",
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
        cwd=tmp,
    )
    (tmp / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _run(
        "openssl",
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        cwd=tmp,
    )
    port = free_port()
    server = subprocess.Popen(
        [
            "redis-server",
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            "server.crt",
            "--tls-key-file",
            "server.key",
            "--tls-ca-cert-file",
            "ca.crt",
            "--tls-auth-clients",
            "no",
            "--requirepass",
            PASSWORD,
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        cwd=tmp,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                redis.Redis(port=port, ssl=True, ssl_ca_certs=str(tmp / "ca.crt"), password=PASSWORD).ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    pytest.fail("the TLS redis-server did not start within 15 s")
                time.sleep(0.2)
        yield port, tmp / "ca.crt"
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_hook_reaches_redis_over_tls_with_every_connection_setting(
    monkeypatch: pytest.MonkeyPatch, tls_server: tuple[int, Path]
) -> None:
    port, ca = tls_server
    prefix = f"tls:{uuid.uuid4().hex[:6]}:"
    spec = {
        "conn_type": "babelqueue+redis",
        "host": "127.0.0.1",
        "port": port,
        "password": PASSWORD,
        "extra": {"ssl": "true", "ssl_ca_certs": str(ca), "db": 3, "key_prefix": prefix},
    }
    monkeypatch.setenv("AIRFLOW_CONN_BQ_TLS", json.dumps(spec))
    hook = get_hook("bq_tls")
    assert hook.test_connection() == (True, f"Connected to BabelQueue Redis at 127.0.0.1:{port}")
    binding = hook.get_binding()
    body = bq.encode(bq.make_envelope("urn:babel:orders:created", {"tls": True}, queue_name="orders"))
    binding.publish(body, "orders")
    raw = redis.Redis(port=port, ssl=True, ssl_ca_certs=str(ca), password=PASSWORD, db=3)
    assert raw.lrange(f"{prefix}orders", 0, -1) == [body]
    message = binding.reserve("orders", timeout=1)
    assert message is not None and message.body == body
    binding.ack(message)
    assert raw.llen(f"{prefix}orders") == 0 and raw.llen(f"{prefix}orders:processing") == 0
    hook.close()
    raw.close()


def test_plain_connection_to_a_tls_port_fails_clearly(tls_server: tuple[int, Path]) -> None:
    port, _ = tls_server
    binding = RedisBinding(RedisConfig(port=port, password=PASSWORD, socket_timeout=2))
    with pytest.raises(BindingError, match=f"127.0.0.1:{port}.*TLS is off") as info:
        binding.ping()
    assert PASSWORD not in str(info.value)


def test_untrusted_certificate_is_refused(tls_server: tuple[int, Path]) -> None:
    port, _ = tls_server
    binding = RedisBinding(RedisConfig(port=port, password=PASSWORD, ssl=True, socket_timeout=2))
    with pytest.raises(BindingError, match=f"127.0.0.1:{port}") as info:
        binding.ping()
    assert "CERTIFICATE_VERIFY_FAILED" in str(info.value) or "certificate" in str(info.value).lower()
