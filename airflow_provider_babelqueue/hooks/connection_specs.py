"""The six BabelQueue connection types, each declared once.

Their names are ``babelqueue+<broker>``; the earlier names (``babelqueue_<broker>``) are kept as
``former_conn_types`` and still resolve to the same hook (see :mod:`airflow_provider_babelqueue.hooks`).

Each hook reads its extras through its spec, the provider info lists them from it, and the extras tables of
``docs/connections/*.md`` are rendered from it. Change a field here and all three follow (the docs page is
checked by a test that prints the table to paste).

Pure module: standard library only (see :mod:`airflow_provider_babelqueue.hooks.fields`).
"""

from __future__ import annotations

from .fields import ConnectionSpec, Extra, UiBehaviour

__all__ = ["AZURE_SERVICE_BUS", "CONNECTION_SPECS", "PULSAR", "RABBITMQ", "REDIS", "SQL", "SQS"]

_HOOKS = "airflow_provider_babelqueue.hooks"


def _visibility_timeout(description: str, *, doc: str, default: float | None = None,
                        exclusive_minimum: float | None = None, doc_default: str = "") -> Extra:
    """The seconds after which a reservation nobody settled is delivered again (three brokers share the words)."""
    return Extra("visibility_timeout", "float", "Visibility timeout (s)", description, default=default,
                 exclusive_minimum=exclusive_minimum, doc=doc, doc_default=doc_default)


def _max_message_bytes(description: str, *, doc: str, default: int, minimum: int, maximum: int | None = None,
                       doc_default: str = "") -> Extra:
    """The size limit checked before sending (every broker has one; the numbers differ)."""
    return Extra("max_message_bytes", "int", "Max message bytes", description, default=default, minimum=minimum,
                 maximum=maximum, doc=doc, doc_default=doc_default)


def _dead_letter_suffix(description: str, *, doc: str, default: str) -> Extra:
    """The DLQ name's suffix after the queue name."""
    return Extra("dead_letter_suffix", "str", "Dead-letter suffix", description, default=default, doc=doc)


def _dead_letter_sources(description: str, *, doc: str, default: str | None = None, doc_default: str = "") -> Extra:
    """The DLQs every read takes besides the written one. Not converted here: the hook hands the raw value (a JSON
    list, or comma text from the form) to the config, which splits and checks it (``Binding.source_entries``)."""
    return Extra("dead_letter_sources", "str", "Dead-letter sources", description, default=default,
                 to_config=False, doc=doc, doc_default=doc_default)


def _console_queues() -> Extra:
    """The queues the dead-letter console lists for the connection (every connection type takes it)."""
    return Extra("console_queues", "str", "Console queues",
                 "Queues the dead-letter console lists for this connection (comma-separated)", to_config=False,
                 doc="queues the dead-letter console lists for this connection (a JSON list or comma text), beside "
                     "those the broker can list")


SQL = ConnectionSpec(
    conn_type="babelqueue+sql",
    former_conn_types=("babelqueue_sql",),
    hook_name="BabelQueue SQL",
    hook_class=f"{_HOOKS}.sql.BabelQueueSqlHook",
    ui=UiBehaviour(
        hidden=("extra",),
        relabeling={"host": "Host, or SQLite file path", "schema": "Database"},
        placeholders={"host": "/opt/airflow/babelqueue.sqlite  or  db.internal"},
    ),
    extras=(
        Extra("dialect", "enum", "Dialect", "sqlite (default: host is the file path) or postgresql",
              default="sqlite", choices=("sqlite", "postgresql"), aliases={"postgres": "postgresql"},
              to_config=False, doc="`sqlite` or `postgresql`"),
        Extra("sqlalchemy_url", "str", "SQLAlchemy URL", "Overrides the fields above, for any SQLAlchemy driver",
              secret=True, to_config=False,
              doc="a full SQLAlchemy URL for any driver; overrides the fields above (treated as a secret in the UI)"),
        Extra("table", "str", "Table", "Ready-message table; dead letters go to <table>_failed", default="jobs",
              doc="ready-message table; dead letters go to `<table>_failed`. Letters, digits and `_` only"),
        _dead_letter_sources(
            "More dead-letter tables to read (same layout): names, _suffixes or {table} templates, comma-separated",
            doc_default="none",
            doc="more dead-letter tables every read takes after `<table>_failed` (same layout; never created): a "
            "JSON list or comma text of full names, suffixes after the table (`_dlq`) or `{table}` templates"),
        _visibility_timeout(
            "An unacked reservation returns to the queue after this many seconds", default=300,
            doc="seconds after which a reservation that was neither acked, released nor dead-lettered returns to "
            "the queue"),
        _max_message_bytes(
            "Larger bodies are refused before the INSERT (SQLite's limit is 10^9 bytes)", default=1_000_000_000,
            minimum=1,
            doc="a larger body is refused before the INSERT, naming this limit (SQLite's `SQLITE_MAX_LENGTH`)"),
        Extra("sslmode", "enum", "PostgreSQL sslmode", "libpq's sslmode; empty: libpq's default (prefer)",
              choices=("disable", "allow", "prefer", "require", "verify-ca", "verify-full"), to_config=False,
              doc="PostgreSQL: `disable`, `require`, `verify-ca` or `verify-full`", doc_default="libpq's (`prefer`)"),
        Extra("sslrootcert", "path", "PostgreSQL CA bundle path", to_config=False,
              doc="PostgreSQL: CA bundle path, for `verify-ca` / `verify-full`"),
        Extra("sslcert", "path", "PostgreSQL client certificate path", to_config=False,
              doc="PostgreSQL: client certificate path, for certificate authentication"),
        Extra("sslkey", "path", "PostgreSQL client key path", to_config=False,
              doc="PostgreSQL: client key path, for certificate authentication (with `sslcert`)"),
        _console_queues(),
    ),
)

REDIS = ConnectionSpec(
    conn_type="babelqueue+redis",
    former_conn_types=("babelqueue_redis",),
    hook_name="BabelQueue Redis",
    hook_class=f"{_HOOKS}.redis.BabelQueueRedisHook",
    ui=UiBehaviour(
        hidden=("schema", "extra"),
        relabeling={"login": "ACL user"},
        placeholders={"host": "127.0.0.1", "port": "6379"},
    ),
    extras=(
        Extra("db", "int", "Database number", default=0, must="a database number", doc="database number"),
        Extra("ssl", "bool", "TLS (rediss)", default=False, doc="TLS (the `rediss://` scheme)"),
        Extra("ssl_ca_certs", "path", "CA bundle path", doc="CA bundle path for TLS"),
        Extra("key_prefix", "str", "Key prefix", "Prepended to every key this connection touches",
              doc="prepended to every key the connection touches", doc_default='`""`'),
        _dead_letter_suffix(
            "Dead letters are written to <queue><suffix>; ':failed' is the spec's", default=":failed",
            doc="dead letters are written to the list `<queue><suffix>` (the spec's `:failed`; the official SDKs' "
            "apps write `.dlq`)"),
        _dead_letter_sources(
            "DLQ lists reads also take: suffixes, names or {queue} templates, comma-separated; 'none': no more",
            default=":failed,.dlq",
            doc="DLQ lists every read (count, drain, browse, redrive) takes after the written one: a JSON list or "
            "comma text of suffixes, full names or `{queue}` templates (`none` or `[]`: no more); `.dlq` is where "
            "the official SDKs' workers write"),
        Extra("frames", "bool", "Write header frames",
              "With headers, publish the SDKs' {\"__bq_frame\":1,...} frame (not in the spec)", default=False,
              doc="`publish(headers=...)` stores the SDKs' header frame (Node, Python) instead of the bare envelope; "
              "off (the spec), headers are dropped. Frames are unwrapped on reserve either way"),
        _visibility_timeout(
            "A reservation left by a crashed consumer returns to the queue after this", default=300,
            doc="seconds before a reservation left by a crashed consumer returns to the queue"),
        _max_message_bytes(
            "Refused before sending when larger; Redis allows 512 MiB", default=536_870_912, minimum=1,
            doc_default="`536870912` (512 MiB)",
            doc="a larger body is refused before sending, naming this limit; Redis's `proto-max-bulk-len`"),
        _console_queues(),
    ),
)

RABBITMQ = ConnectionSpec(
    conn_type="babelqueue+rabbitmq",
    former_conn_types=("babelqueue_rabbitmq",),
    hook_name="BabelQueue RabbitMQ",
    hook_class=f"{_HOOKS}.rabbitmq.BabelQueueRabbitMQHook",
    ui=UiBehaviour(
        hidden=("extra",),
        relabeling={"schema": "Virtual host"},
        placeholders={"host": "127.0.0.1", "port": "5672", "schema": "/", "login": "guest"},
    ),
    extras=(
        Extra("ssl", "bool", "TLS (amqps)", default=False, doc="AMQPS (TLS)"),
        Extra("ssl_ca_certs", "path", "CA bundle path",
              doc="CA bundle path for a server certificate the system store does not trust"),
        _dead_letter_suffix(
            "Dead letters are written to <queue><suffix>; '.failed' is the spec's", default=".failed",
            doc="dead letters are written to `<queue><suffix>` (the spec's `.failed`; the official SDKs' apps "
            "write `.dlq`)"),
        _dead_letter_sources(
            "DLQs reads also take: suffixes, names or {queue} templates, comma-separated; 'none': no more",
            default=".failed,.dlq",
            doc="DLQs every read (count, drain, redrive) takes after the written one, by passive declare (a missing "
            "one is empty, never created): a JSON list or comma text of suffixes, full names or `{queue}` "
            "templates (`none` or `[]`: no more); `.dlq` is where the official SDKs' workers write"),
        Extra("declare_queues", "bool", "Declare missing queues",
              "Off: only use queues someone else declared (passive declares)", default=True,
              doc="create missing queues (durable, no arguments); `false` = only use queues someone declared "
              "(passive declares), a missing one is an error"),
        Extra("publisher_confirms", "bool", "Publisher confirms", "Wait for the broker to confirm every publish",
              default=True, doc="wait for the broker's confirm of every publish and every body of a batch"),
        Extra("heartbeat", "int", "Heartbeat (s)", "Empty: the broker's (60); 0 turns heartbeats off", minimum=0,
              doc="AMQP heartbeat in whole seconds; `0` turns heartbeats off", doc_default="broker's (60)"),
        _max_message_bytes(
            "Refused before sending when larger; RabbitMQ allows 128 MiB", default=134_217_728, minimum=1,
            doc_default="`134217728` (128 MiB)",
            doc="a larger body is refused before sending, naming this limit; set it to your broker's "
            "`max_message_size`"),
        _console_queues(),
    ),
)

SQS = ConnectionSpec(
    conn_type="babelqueue+sqs",
    former_conn_types=("babelqueue_sqs",),
    hook_name="BabelQueue Amazon SQS",
    hook_class=f"{_HOOKS}.sqs.BabelQueueSqsHook",
    ui=UiBehaviour(
        hidden=("host", "port", "schema", "extra"),
        relabeling={"login": "AWS access key id", "password": "AWS secret access key"},
        placeholders={"login": "empty: default chain", "password": "empty: default chain"},
    ),
    extras=(
        Extra("region_name", "str", "Region", "e.g. eu-west-1; empty: AWS_DEFAULT_REGION or the profile",
              doc="region, e.g. `eu-west-1` (else `AWS_DEFAULT_REGION` / the profile)", doc_default="AWS config"),
        Extra("endpoint_url", "str", "Endpoint URL", "A VPC endpoint, LocalStack or moto; empty for AWS",
              doc="another endpoint: a VPC endpoint, LocalStack, moto", doc_default="AWS"),
        Extra("aws_session_token", "str", "Session token", "For temporary credentials", secret=True,
              doc="session token for temporary credentials (masked like the secret)"),
        Extra("role_arn", "str", "Role ARN", "Assume this IAM role through STS (refreshed before it expires)",
              doc="assume this IAM role through STS; credentials refresh before they expire"),
        Extra("fifo_group_id", "str", "FIFO group id", "MessageGroupId on .fifo queues; empty: the queue name",
              doc="`MessageGroupId` on FIFO queues", doc_default="queue name"),
        Extra("content_based_dedup", "bool", "Content-based deduplication",
              "Send no MessageDeduplicationId (the FIFO queue hashes the body)", default=False,
              doc="send no `MessageDeduplicationId` (the FIFO queue hashes the body)"),
        _dead_letter_suffix(
            "DLQ = <queue><suffix> without a RedrivePolicy; '-dlq' for the SDKs' apps", default="-failed",
            doc="where dead letters are written without a RedrivePolicy: `<queue><suffix>` (FIFO: "
            "`<queue><suffix>.fifo`)"),
        Extra("dead_letter_sources", "str", "Dead-letter sources",
              "DLQs reads also take (counts, drains, redrives): suffixes, names or {queue} templates, "
              "comma-separated; 'none': only the written one", default="-failed,-dlq", to_config=False,
              doc="DLQs every read takes after the RedrivePolicy target and the written one: comma-separated "
              "suffixes, full names or `{queue}` templates (`none`: no more); `-dlq` is where the official "
              "SDKs' workers write"),
        _max_message_bytes(
            "Checked before sending (body + attributes); SQS allows up to 1048576", default=1_048_576,
            minimum=1024, maximum=1_048_576,
            doc="largest message accepted before sending (body + attributes), 1024–1048576"),
        Extra("include_in_flight_in_depth", "bool", "Depth includes in-flight",
              "Count in-flight and delayed messages in depth", default=False,
              doc="`depth` also counts in-flight and delayed messages"),
        Extra("create_queues", "bool", "Create missing queues",
              "On: a missing queue (and its -failed DLQ) is created on first use; off: it is an error",
              default=False,
              doc="create a missing queue (and the fallback DLQ) on first use, with this connection's settings; "
              "off, a missing queue is an error naming it, so a typo never creates a queue nobody reads"),
        Extra("visibility_timeout", "int", "Visibility timeout (s)",
              "Whole seconds a received message stays hidden; empty: the queue's own", minimum=0, maximum=43200,
              doc="whole seconds a received message stays hidden (sent with every receive)",
              doc_default="queue's own"),
        Extra("wait_time_seconds", "int", "Long-poll wait (s)", "Longest single ReceiveMessage wait", default=20,
              minimum=1, maximum=20, doc="longest single long poll (1–20 s); `reserve` loops for longer timeouts"),
        _console_queues(),
    ),
)

PULSAR = ConnectionSpec(
    conn_type="babelqueue+pulsar",
    former_conn_types=("babelqueue_pulsar",),
    hook_name="BabelQueue Apache Pulsar",
    hook_class=f"{_HOOKS}.pulsar.BabelQueuePulsarHook",
    ui=UiBehaviour(
        hidden=("login", "schema", "extra"),
        relabeling={"host": "Broker host or service URL", "password": "Token (JWT)"},
        placeholders={"host": "pulsar.internal  or  pulsar+ssl://pulsar.internal:6651", "port": "6650"},
    ),
    extras=(
        Extra("ssl", "bool", "TLS (pulsar+ssl)", default=False, to_config=False,
              doc="TLS: the service URL becomes `pulsar+ssl://host:6651` and the default admin URL "
              "`https://host:8443`"),
        Extra("admin_url", "str", "Admin URL",
              "Admin REST API for queue depths; empty: http://<host>:8080 (https://<host>:8443)", to_config=False,
              doc="the admin REST API, where `depth` / `dead_letter_depth` read topic stats",
              doc_default="`http://<host>:8080`"),
        Extra("tenant", "str", "Tenant", default="public",
              doc="the tenant of bare queue names: `persistent://<tenant>/<namespace>/<queue>`"),
        Extra("namespace", "str", "Namespace", default="default",
              doc="the namespace of bare queue names: `persistent://<tenant>/<namespace>/<queue>`"),
        Extra("subscription", "str", "Subscription", "The Shared subscription every consumer joins",
              default="babelqueue", doc="the Shared subscription every consumer joins (the SDKs' name)"),
        _dead_letter_suffix("DLQ topic = <queue><suffix>", default=".dlq",
                            doc="dead letters go to the topic `<queue><suffix>`"),
        _dead_letter_sources(
            "More DLQ topics to read: suffixes, names or {queue} templates, comma-separated", doc_default="none",
            doc="more dead-letter topics every read takes after the written one (read only when their stats show "
            "messages, so never created): a JSON list or comma text of suffixes, full topic names or `{queue}` "
            "templates"),
        Extra("tls_trust_certs_file_path", "path", "CA bundle path",
              doc="CA bundle for `pulsar+ssl://` and `https://`", doc_default="certifi / system store"),
        Extra("tls_validate_hostname", "bool", "Verify TLS host name", default=True,
              doc="check that the certificate names the host (the Pulsar client's own default is off)"),
        Extra("tls_allow_insecure_connection", "bool", "Accept any TLS certificate", "For a lab only",
              default=False, doc="accept any certificate: for a lab, never for production"),
        _visibility_timeout(
            "An unsettled reservation is negatively acknowledged after this; empty: never", exclusive_minimum=0,
            doc="seconds after which an unsettled reservation is negatively acknowledged (redelivered)",
            doc_default="none"),
        Extra("redelivery_delay", "float", "Redelivery delay (s)",
              "Wait before a negatively acknowledged message is redelivered", default=1, minimum=0,
              doc="seconds before a negatively acknowledged message comes back (the client's default is 60)"),
        Extra("receiver_queue_size", "int", "Receiver queue size",
              "Messages a consumer prefetches; small keeps workers fair and depth close", default=1, minimum=1,
              doc='messages a consumer prefetches (at least 1; see "Counts")'),
        _max_message_bytes("Checked before sending; the broker's maxMessageSize", default=5_242_880, minimum=1024,
                           doc="checked before sending; set it to the broker's `maxMessageSize`"),
        Extra("create_subscription", "bool", "Create the subscription",
              "Before the first publish to a topic, so no message is published unseen", default=True,
              doc='create `babelqueue` before the first publish to a topic (see "Subscriptions")'),
        Extra("operation_timeout_seconds", "int", "Operation timeout (s)", default=30, minimum=1,
              doc="client operations (lookups, subscribe, send) give up after this"),
        _console_queues(),
    ),
)

AZURE_SERVICE_BUS = ConnectionSpec(
    conn_type="babelqueue+servicebus",
    former_conn_types=("babelqueue_azure_service_bus",),
    hook_name="BabelQueue Azure Service Bus",
    hook_class=f"{_HOOKS}.azure_service_bus.BabelQueueAzureServiceBusHook",
    ui=UiBehaviour(
        hidden=("port", "schema", "login", "extra"),
        relabeling={"host": "Fully qualified namespace", "password": "Connection string"},
        placeholders={
            "host": "contoso.servicebus.windows.net (DefaultAzureCredential)",
            "password": "Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...",
        },
    ),
    extras=(
        Extra("native_dead_letter", "bool", "Native dead-lettering",
              "Dead letters go to <queue>/$DeadLetterQueue; off: to the plain DLQ below", default=True,
              doc="dead letters go to the queue's `$DeadLetterQueue` sub-queue; `false`: an annotated copy goes to "
              "the plain queue `<queue><dead_letter_queue_suffix>`"),
        Extra("dead_letter_queue_suffix", "str", "Plain dead-letter queue suffix",
              "The plain DLQ <queue><suffix> written when native dead-lettering is off (and then read too)",
              doc="the plain dead-letter queue `<queue><suffix>` written when `native_dead_letter` is off; when "
              "set, reads take it too"),
        _dead_letter_sources(
            "DLQs reads also take: /$DeadLetterQueue, suffixes, names or {queue} templates, comma-separated",
            default="/$DeadLetterQueue,.dlq",
            doc="DLQs every read (count, drain, browse, redrive) takes after the written one: a JSON list or comma "
            "text of suffixes (`/$DeadLetterQueue` is the native sub-queue), full names or `{queue}` templates "
            "(`none` or `[]`: no more). A missing plain queue is empty, never created; `.dlq` is where the "
            "official SDKs' apps write"),
        Extra("create_queues", "bool", "Create missing queues",
              "Needs Manage rights; off: queues are provisioned elsewhere (IaC)", default=False,
              doc="create missing queues on first use (needs Manage); off: a missing queue is an error naming it"),
        Extra("lock_duration", "float", "Lock duration (s)",
              "PeekLock of queues the hook creates (Service Bus: 5-300); empty: 60", exclusive_minimum=0,
              maximum=300, doc="PeekLock seconds of queues the hook creates (Service Bus accepts 5–300)",
              doc_default="`60`"),
        Extra("max_delivery_count", "int", "Max delivery count",
              "Of queues the hook creates; Service Bus dead-letters past it; empty: 10", minimum=1, maximum=2000,
              doc="of queues the hook creates; Service Bus dead-letters a message delivered more often "
              "(`MaxDeliveryCountExceeded`)", doc_default="`10`"),
        Extra("min_receive_wait", "float", "Shortest receive wait (s)",
              "A receive is a round trip: how long a 'no wait' reserve still waits", default=0.2, minimum=0.01,
              maximum=10, doc="seconds a `reserve(timeout=0)` still waits: a receive is a round trip"),
        Extra("duplicate_detection", "bool", "Queues detect duplicates",
              "RequiresDuplicateDetection is on: retries get MessageId <meta.id>:<attempts>", default=False,
              doc="the queues have `RequiresDuplicateDetection`: retry copies get the MessageId "
              "`<meta.id>:<attempts>`"),
        Extra("use_websockets", "bool", "AMQP over WebSockets", "Port 443, for networks that block AMQP's 5671",
              default=False, doc="AMQP over WebSockets on port 443, for networks that block 5671"),
        Extra("connection_verify", "path", "CA bundle path",
              "Verify TLS with this CA bundle (e.g. behind a TLS-inspecting proxy)",
              doc="a CA bundle to verify TLS with (AMQP and the management API)", doc_default="certifi"),
        _console_queues(),
    ),
)

#: In the order the provider info lists them.
CONNECTION_SPECS: tuple[ConnectionSpec, ...] = (SQL, REDIS, RABBITMQ, SQS, PULSAR, AZURE_SERVICE_BUS)
