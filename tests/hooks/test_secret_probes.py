"""Secret probes: a distinctive secret in every place a connection can hold one, on every connection type, must
appear in none of the strings we build (issue #29, point 5).

For each connection type and each place a secret can sit for it (the password field, an extra, a URL's userinfo,
a URL query parameter such as ``?password=`` / ``?token=`` / ``?sig=``, an Azure ``SharedAccessKey=``), one probe
puts a secret ``S3cr3t-<type>-<place>-q/+@<tag>`` there and checks, with the broker unreachable (a closed port on
127.0.0.1, so every failure is a fast refusal and nothing leaves the machine):

* ``repr`` of the binding's config, ``describe()``, ``test_connection()``'s message (shown unmasked in the UI) and
  ``str``/``repr`` of the :class:`BindingError` an operation raises hold neither the secret nor its
  percent-encoded forms, nor the distinctive part before its special characters (a partial leak);
* those texts still name the host, the database and the non-secret query parameters, so errors stay useful;
* building the binding registered the secret with Airflow's masker, and with it the formatted exception chain
  (driver errors included, which may quote a URL we never built) is clean once Airflow's masker has redacted it.

Then the same for the ``from_url``-style constructors and the config classes on their own, and the pure rule in
:mod:`airflow_provider_babelqueue.bindings.redaction`.
"""

from __future__ import annotations

import json
import secrets
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any
from urllib.parse import quote, quote_plus

import pytest
from airflow.sdk import Connection

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import BindingError
from airflow_provider_babelqueue.bindings.redaction import (
    config_repr,
    is_secret_name,
    redact,
    redact_connection_string,
    redact_url,
    scrub,
    url_secrets,
)
from airflow_provider_babelqueue.hooks import HOOK_CLASSES
from airflow_provider_babelqueue.hooks.base import BabelQueueHook, connection_secrets
from tests.conftest import free_port

SQL, REDIS, RABBITMQ = "babelqueue+sql", "babelqueue+redis", "babelqueue+rabbitmq"
SQS, PULSAR, ASB = "babelqueue+sqs", "babelqueue+pulsar", "babelqueue+servicebus"
SHORT = {SQL: "sql", REDIS: "redis", RABBITMQ: "rabbitmq", SQS: "sqs", PULSAR: "pulsar", ASB: "asb"}


@dataclass(frozen=True)
class Secret:
    """One probe's secret: special characters, so each percent-encoded form differs from the raw one."""

    core: str  # the distinctive part: found in a text, even a truncated copy of the secret leaked
    raw: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "raw", f"{self.core}/+@{secrets.token_hex(3)}")

    @property
    def q(self) -> str:
        """As written inside a URL (userinfo or query value)."""
        return quote(self.raw, safe="")

    def leaks(self, text: str) -> list[str]:
        forms = (self.raw, quote(self.raw, safe=""), quote_plus(self.raw), quote(self.raw), self.core)
        return [form for form in dict.fromkeys(forms) if form in text]


@dataclass(frozen=True)
class Probe:
    """A connection type, a place, and the connection fields that put the secret there.

    :ivar fields: ``(secret, closed port) -> Connection keyword arguments``.
    :ivar keep: what ``describe()`` and the operation's error must still show (beside the host, which
        ``test_connection`` shows too), so messages stay useful.
    :ivar operation: what to run against the unreachable broker to get a :class:`BindingError`.
    """

    conn_type: str
    place: str
    fields: Callable[[Secret, int], dict[str, Any]]
    keep: tuple[str, ...] = ()
    describe_keep: tuple[str, ...] | None = None  # when describe() shows less than the errors (None: same)
    operation: str = "depth"

    @property
    def id(self) -> str:
        return f"{SHORT[self.conn_type]}-{self.place}"


def _sql_url(s: Secret, port: int, auth: str, query: str) -> dict[str, Any]:
    url = f"postgresql+psycopg2://{auth}@127.0.0.1:{port}/bqprobe_db?{query}sslmode=disable&application_name=bqprobe"
    return {"host": "ignored.invalid", "extra": {"sqlalchemy_url": url}}


def _sqs(s: Secret, port: int, extra: dict[str, Any] | None = None, query: str = "") -> dict[str, Any]:
    endpoint = f"http://127.0.0.1:{port}/?{query}probe=visible"
    return {"login": "AKIAPROBE", "password": "filler-secret-key",
            "extra": {"region_name": "us-east-1", "endpoint_url": endpoint, **(extra or {})}}


def _pulsar(port: int, **fields: Any) -> dict[str, Any]:
    extra = {"admin_url": f"http://127.0.0.1:{port}", "operation_timeout_seconds": 1, **fields.pop("extra", {})}
    return {"host": "127.0.0.1", "port": port, **fields, "extra": extra}


def _asb(port: int, credential: str) -> dict[str, Any]:
    return {"password": f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=RootProbe;{credential};"
                        "UseDevelopmentEmulator=true"}


SQL_KEEP = ("bqprobe_db", "sslmode=disable", "application_name=bqprobe")
PROBES = [
    Probe(SQL, "password-field",
          lambda s, port: {"host": "127.0.0.1", "port": port, "login": "bq", "password": s.raw, "schema": "bqprobe_db",
                           "extra": {"dialect": "postgresql", "sslmode": "disable"}},
          keep=("bqprobe_db", "sslmode=disable"), describe_keep=("bqprobe_db",)),
    Probe(SQL, "url-userinfo", lambda s, port: _sql_url(s, port, f"bq:{s.q}", ""), keep=SQL_KEEP),
    Probe(SQL, "url-query-password", lambda s, port: _sql_url(s, port, "bq", f"password={s.q}&"), keep=SQL_KEEP),
    Probe(SQL, "url-query-token", lambda s, port: _sql_url(s, port, "bq", f"token={s.q}&"), keep=SQL_KEEP),
    Probe(REDIS, "password-field",
          lambda s, port: {"host": "127.0.0.1", "port": port, "login": "bq", "password": s.raw}),
    Probe(RABBITMQ, "password-field",
          lambda s, port: {"host": "127.0.0.1", "port": port, "login": "bq", "password": s.raw,
                           "extra": {"socket_timeout": 2}}),
    Probe(SQS, "password-field",
          lambda s, port: {**_sqs(s, port), "password": s.raw}, keep=("probe=visible",)),
    Probe(SQS, "session-token-extra",
          lambda s, port: _sqs(s, port, {"aws_session_token": s.raw}), keep=("probe=visible",)),
    Probe(SQS, "url-userinfo",
          lambda s, port: {**_sqs(s, port), "extra": {"region_name": "us-east-1",
                                                      "endpoint_url": f"http://bq:{s.q}@127.0.0.1:{port}/?probe=visible"}},
          keep=("probe=visible",)),
    *(Probe(SQS, f"url-query-{name}", lambda s, port, name=name: _sqs(s, port, query=f"{name}={s.q}&"),
            keep=("probe=visible",))
      for name in ("token", "aws_secret_access_key", "sig", "sas", "X-Amz-Security-Token")),
    Probe(PULSAR, "token-field", lambda s, port: _pulsar(port, password=s.raw)),
    Probe(PULSAR, "host-url-userinfo",
          lambda s, port: _pulsar(port, host=f"pulsar://bq:{s.q}@127.0.0.1:{port}?probe=visible"),
          keep=("probe=visible",), operation="publish"),
    Probe(PULSAR, "host-url-query-token",
          lambda s, port: _pulsar(port, host=f"pulsar://127.0.0.1:{port}?token={s.q}&probe=visible"),
          keep=("probe=visible",), operation="publish"),
    Probe(PULSAR, "admin-url-userinfo",
          lambda s, port: _pulsar(port, extra={"admin_url": f"http://bq:{s.q}@127.0.0.1:{port}"})),
    Probe(PULSAR, "admin-url-query-token",
          lambda s, port: _pulsar(port, extra={"admin_url": f"http://127.0.0.1:{port}/?token={s.q}"})),
    Probe(ASB, "shared-access-key", lambda s, port: _asb(port, f"SharedAccessKey={s.raw}")),
    Probe(ASB, "shared-access-signature",
          lambda s, port: _asb(port, "SharedAccessSignature=SharedAccessSignature sr=sb%3A%2F%2F127.0.0.1"
                                     f"&sig={s.q}&se=4102444800&skn=RootProbe")),
]
assert {probe.conn_type for probe in PROBES} == set(HOOK_CLASSES), "a connection type has no probe"


def _hook(conn_type: str, connection: Connection) -> BabelQueueHook:
    module, _, name = HOOK_CLASSES[conn_type].rpartition(".")
    cls: type[BabelQueueHook] = getattr(import_module(module), name)
    return cls(connection.conn_id, connection=connection)


def _formatted(exc: BaseException) -> str:
    """``str``, ``repr`` and the whole formatted chain, causes included, as a task log prints it."""
    return "\n".join([str(exc), repr(exc), "".join(traceback.format_exception(exc))])


def _operate(binding: Any, operation: str) -> BaseException:
    body = bq.encode(bq.make_envelope("urn:babel:probe:secret", {"n": 1}, queue_name="orders"))
    with pytest.raises(BindingError) as caught:
        if operation == "publish":
            binding.publish(body, "orders")
        else:
            binding.depth("orders")
    return caught.value


@pytest.fixture
def masked(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """What the hooks register with Airflow's masker. Patched because a missing registration cannot be observed
    otherwise: ``dag.test()`` and this process print unmasked, and what the masker hides depends on what every
    earlier test registered. The real function still runs, so Airflow's ``redact`` below sees the same secrets."""
    import airflow.sdk.log as sdk_log

    seen: list[str] = []
    real = sdk_log.mask_secret

    def record(secret: Any, name: str | None = None) -> None:
        seen.append(secret)
        real(secret, name)

    monkeypatch.setattr(sdk_log, "mask_secret", record)
    yield seen


@pytest.fixture
def fast_service_bus(monkeypatch: pytest.MonkeyPatch) -> None:
    """No retries in the Service Bus SDK: each refused call would otherwise take ~5 s of back-off (retries are
    not what these tests are about)."""
    from airflow_provider_babelqueue.bindings.azure_service_bus import AzureServiceBusBinding

    options = AzureServiceBusBinding._options
    monkeypatch.setattr(AzureServiceBusBinding, "_options", lambda self: {**options(self), "retry_total": 0})


@pytest.mark.usefixtures("fast_service_bus")
@pytest.mark.parametrize("probe", PROBES, ids=[probe.id for probe in PROBES])
def test_no_secret_in_what_a_hook_builds(probe: Probe, masked: list[str]) -> None:
    from airflow.sdk._shared.secrets_masker import redact as airflow_redact

    secret = Secret(f"S3cr3t-{SHORT[probe.conn_type]}-{probe.place}-q")
    fields = probe.fields(secret, free_port())
    fields["extra"] = json.dumps(fields.get("extra", {}))
    hook = _hook(probe.conn_type, Connection(conn_id=f"probe_{secrets.token_hex(3)}", conn_type=probe.conn_type,
                                             **fields))
    keep = ("127.0.0.1", *probe.keep)
    try:
        ok, message = hook.test_connection()
        assert ok is False, message
        assert secret.leaks(message) == [], f"test_connection: {message}"
        assert "127.0.0.1" in message, message  # Pulsar's names the admin URL, the others the broker

        described = hook.describe(hook.connection)
        assert secret.leaks(described) == [], f"describe: {described}"
        assert all(part in described for part in ("127.0.0.1", *(probe.describe_keep or probe.keep))), described

        masked.clear()
        binding = hook.get_binding()
        assert secret.raw in masked, "the secret was not registered with Airflow's masker"
        assert secret.leaks(repr(binding.config)) == [], repr(binding.config)

        error = _operate(binding, probe.operation)
        assert secret.leaks(str(error)) == [] and secret.leaks(repr(error)) == [], str(error)
        assert all(part in str(error) for part in keep), (keep, str(error))
        # the whole chain (a driver's own exception may quote the URL) as Airflow's masker prints it in a task log
        assert secret.leaks(airflow_redact(_formatted(error))) == []
    finally:
        hook.close()


# --------------------------------------------------------------------- configs and from_url constructors


def _configs(s: Secret, port: int) -> Iterator[tuple[str, Callable[[], Any], tuple[str, ...]]]:
    from airflow_provider_babelqueue.bindings.pulsar import PulsarConfig
    from airflow_provider_babelqueue.bindings.rabbitmq import RabbitMQConfig
    from airflow_provider_babelqueue.bindings.redis import RedisConfig
    from airflow_provider_babelqueue.bindings.sql import SqlConfig
    from airflow_provider_babelqueue.bindings.sqs import SqsConfig

    yield ("redis-from-url", lambda: RedisConfig.from_url(f"redis://bq:{s.q}@127.0.0.1:{port}/0?key_prefix=probe:"),
           ("key_prefix='probe:'",))
    yield ("rabbitmq-from-url", lambda: RabbitMQConfig.from_url(f"amqp://bq:{s.q}@127.0.0.1:{port}/?heartbeat=0"),
           ("heartbeat=0",))
    yield ("sql-query-password", lambda: SqlConfig(url=f"postgresql+psycopg2://bq@127.0.0.1:{port}/bqprobe_db?"
                                                       f"password={s.q}&sslmode=disable"), ("sslmode=disable",))
    yield ("sqs-endpoint-query", lambda: SqsConfig(region_name="us-east-1", aws_access_key_id="AKIAPROBE",
                                                   aws_secret_access_key=s.raw,
                                                   endpoint_url=f"http://127.0.0.1:{port}/?sig={s.q}&probe=visible"),
           ("probe=visible",))
    yield ("pulsar-urls", lambda: PulsarConfig(service_url=f"pulsar://bq:{s.q}@127.0.0.1:{port}",
                                               admin_url=f"http://127.0.0.1:{port}/?token={s.q}&probe=visible",
                                               token=s.raw), ("probe=visible",))


@pytest.mark.parametrize("case", ["redis-from-url", "rabbitmq-from-url", "sql-query-password", "sqs-endpoint-query",
                                  "pulsar-urls"])
def test_no_secret_in_config_reprs_and_binding_errors(case: str) -> None:
    from airflow_provider_babelqueue.bindings import pulsar, rabbitmq, redis, sql, sqs

    secret = Secret(f"S3cr3t-config-{case}-q")
    [(make, keep)] = [(make, keep) for name, make, keep in _configs(secret, free_port()) if name == case]
    config = make()
    assert secret.leaks(repr(config)) == [] and "127.0.0.1" in repr(config), repr(config)
    assert all(part in repr(config) for part in keep), repr(config)
    kinds = {"redis": redis.RedisBinding, "rabbitmq": rabbitmq.RabbitMQBinding, "sql": sql.SqlBinding,
             "sqs": sqs.SqsBinding, "pulsar": pulsar.PulsarBinding}
    binding = kinds[case.split("-")[0]](config)
    try:
        error = _operate(binding, "publish" if case == "pulsar-urls" else "depth")
        assert secret.leaks(str(error)) == [] and "127.0.0.1" in str(error), str(error)
    finally:
        binding.close()


@pytest.mark.parametrize("case", ["redis-query", "rabbitmq-query", "redis-unencoded", "rabbitmq-unencoded",
                                  "sql-unparsable", "pulsar-scheme", "pulsar-admin-scheme", "sqs-config"])
def test_refused_urls_do_not_quote_their_secrets(case: str) -> None:
    """A constructor that refuses a URL says why without repeating the secret (its message reaches the UI through
    the hook's ``make_config``)."""
    from airflow_provider_babelqueue.bindings.pulsar import PulsarConfig
    from airflow_provider_babelqueue.bindings.rabbitmq import RabbitMQConfig
    from airflow_provider_babelqueue.bindings.redis import RedisConfig
    from airflow_provider_babelqueue.bindings.sql import SqlConfig
    from airflow_provider_babelqueue.bindings.sqs import SqsConfig

    s = Secret(f"S3cr3t-refused-{case}-q")
    unencoded = f"{s.core}/{s.core}"  # a '/' in the password cuts the netloc: urlsplit sees part of it as a port
    makers: dict[str, Callable[[], Any]] = {
        "redis-query": lambda: RedisConfig.from_url(f"redis://127.0.0.1:1/0?password={s.q}"),
        "rabbitmq-query": lambda: RabbitMQConfig.from_url(f"amqp://127.0.0.1:1/?password={s.q}"),
        "redis-unencoded": lambda: RedisConfig.from_url(f"redis://bq:{unencoded}@127.0.0.1:1/0"),
        "rabbitmq-unencoded": lambda: RabbitMQConfig.from_url(f"amqp://bq:{unencoded}@127.0.0.1:1/"),
        "sql-unparsable": lambda: SqlConfig(url=f"::not a url?password={s.q}"),
        "pulsar-scheme": lambda: PulsarConfig(service_url=f"http://bq:{s.q}@127.0.0.1:1?token={s.q}"),
        "pulsar-admin-scheme": lambda: PulsarConfig(admin_url=f"ftp://bq:{s.q}@127.0.0.1:1?token={s.q}"),
        "sqs-config": lambda: SqsConfig(endpoint_url=f"http://127.0.0.1:1/?token={s.q}", aws_secret_access_key=s.raw),
    }
    with pytest.raises(ValueError) as caught:
        makers[case]()
    assert secret_free(s, _formatted(caught.value)), _formatted(caught.value)


def secret_free(s: Secret, text: str) -> bool:
    return s.leaks(text) == []


# ------------------------------------------------------------------------------------------ the pure rule


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u@db:5432/app?password=s3cr3t&sslmode=require",
         "postgresql://u@db:5432/app?password=***&sslmode=require"),
        ("postgresql+psycopg2://u:p%40ss@db/app", "postgresql+psycopg2://u:***@db/app"),
        ("https://h:8443/x?X-Amz-Security-Token=t0k&sig=abc%2B&se=1&api_key=k&Region=eu",
         "https://h:8443/x?X-Amz-Security-Token=***&sig=***&se=1&api_key=***&Region=eu"),
        ("redis://h:6379/0?key_prefix=app:&token=t", "redis://h:6379/0?key_prefix=app:&token=***"),
        ("http://h:1/x", "http://h:1/x"),
        ("us-east-1", "us-east-1"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected == redact(url)


def test_redact_connection_string_and_url_secrets() -> None:
    key = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=K3y+/=="
    assert redact_connection_string(key) == (
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=***")
    assert url_secrets(key) == ["K3y+/=="]
    sas = "Endpoint=sb://ns/;SharedAccessSignature=SharedAccessSignature sr=sb%3A%2F%2Fns&sig=Ab%2Bc%3D&se=1&skn=R"
    assert redact(sas) == "Endpoint=sb://ns/;SharedAccessSignature=***"
    assert {"Ab%2Bc%3D", "Ab+c="} <= set(url_secrets(sas))  # the signature, raw and decoded, besides the whole token
    assert set(url_secrets("postgresql://u:p%40ss@h/db?password=q%2Fr&sslmode=require")) == {"p%40ss", "p@ss",
                                                                                            "q%2Fr", "q/r"}
    assert url_secrets("plain-password") == [] and url_secrets(None) == []
    assert scrub("failed at http://u:pw-1@h/?token=t%2B1 (t+1)", url_secrets("http://u:pw-1@h/?token=t%2B1")) == (
        "failed at http://u:***@h/?token=*** (***)")


def test_secret_names_and_scrub() -> None:
    for name in ("password", "PASSWD", "pwd", "sslpassword", "api_key", "AccountKey", "X-Amz-Security-Token",
                 "client_secret", "credentials", "auth", "sig", "SharedAccessSignature", "sas"):
        assert is_secret_name(name), name
    for name in ("sslmode", "host", "key_prefix", "SharedAccessKeyName", "sslkey", "region", "application_name"):
        assert not is_secret_name(name), name
    assert scrub("a p@ss b p%40ss c p%40ss-longer", ["p@ss", "p%40ss-longer"]) == "a *** b *** c ***"


def test_connection_secrets_include_query_parameters_and_skip_mere_encodings() -> None:
    connection = Connection(conn_id="c", conn_type=SQL, host="pulsar://h:1?token=host-t0ken", password="pw-field-1")
    extras = {"sqlalchemy_url": "postgresql://u@h/db?password=qu%2Fery-pw&sslmode=disable", "table": "jobs"}
    assert sorted(connection_secrets(connection, extras)) == ["host-t0ken", "pw-field-1", "qu/ery-pw"]


def test_config_repr_redacts_url_fields() -> None:
    from airflow_provider_babelqueue.bindings.pulsar import PulsarConfig

    config = PulsarConfig(service_url="pulsar://u:pw-9@h:6650", admin_url="http://h:8080/?token=tk-9", token="tk-9")
    assert config_repr(config) == repr(config)
    assert "pw-9" not in repr(config) and "tk-9" not in repr(config) and "admin_url='http://h:8080/?token=***'" in repr(
        config)
