"""The ``babelqueue`` asset URI scheme: a queue, or its dead letters, on a BabelQueue connection.

``babelqueue://<conn id>/<queue>`` names the messages of a queue; ``babelqueue://<conn id>/<queue>/dead-letters``
its dead-letter queue (the URIs the sample DAGs use). The connection id, not a host, is the authority: the same
DAG runs against whichever broker the connection points at. Registered in the provider info (``asset-uris``):
Airflow normalises such URIs with :func:`sanitize_uri`, DAG code can build them with :func:`create_asset`, and
OpenLineage names them with :func:`convert_asset_to_openlineage` (a namespace per broker, from the connection:
:func:`lineage_namespace`, which the operators' own lineage in :mod:`~airflow_provider_babelqueue.lineage` uses too).

Pure apart from the two functions that build Airflow or OpenLineage objects, which import them when called.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, quote, unquote, urlsplit

if TYPE_CHECKING:
    from airflow.sdk import Asset

__all__ = [
    "DEAD_LETTERS",
    "SCHEME",
    "asset_uri",
    "connection_namespace",
    "convert_asset_to_openlineage",
    "create_asset",
    "lineage_identity",
    "lineage_namespace",
    "parse_uri",
    "sanitize_uri",
]

SCHEME = "babelqueue"
#: The last path segment that makes a URI name the queue's dead letters.
DEAD_LETTERS = "dead-letters"
_FORM = "babelqueue://<conn id>/<queue> or babelqueue://<conn id>/<queue>/dead-letters"


def parse_uri(uri: str | SplitResult) -> tuple[str, str, bool]:
    """``(conn id, queue, dead letters?)`` of a ``babelqueue://`` URI; ``ValueError`` saying the form otherwise."""
    parts = urlsplit(uri) if isinstance(uri, str) else uri
    if parts.scheme != SCHEME:
        raise ValueError(f"{parts.geturl()!r} is not a {SCHEME}:// URI ({_FORM})")
    if not parts.netloc:
        raise ValueError(f"{parts.geturl()!r} names no connection id ({_FORM})")
    segments = [unquote(segment) for segment in parts.path.split("/") if segment]
    dead = len(segments) > 1 and segments[-1] == DEAD_LETTERS
    if dead:
        segments = segments[:-1]
    if not segments:
        raise ValueError(f"{parts.geturl()!r} names no queue ({_FORM})")
    return unquote(parts.netloc), "/".join(segments), dead


def asset_uri(babelqueue_conn_id: str, queue_name: str, *, dead_letters: bool = False) -> str:
    """The URI of a queue (or of its dead letters) on a connection."""
    path = "/".join(quote(segment, safe="") for segment in queue_name.split("/"))
    return f"{SCHEME}://{quote(babelqueue_conn_id, safe='')}/{path}" + (f"/{DEAD_LETTERS}" if dead_letters else "")


def sanitize_uri(uri: SplitResult) -> SplitResult:
    """Airflow's normaliser for the scheme: the form is checked, empty segments and a trailing slash dropped, and
    the query and fragment (which name nothing here) removed, so equal queues compare equal."""
    conn_id, queue_name, dead = parse_uri(uri)
    return urlsplit(asset_uri(conn_id, queue_name, dead_letters=dead))


def create_asset(*, babelqueue_conn_id: str, queue_name: str, dead_letters: bool = False,
                 extra: dict[str, Any] | None = None) -> Asset:
    """An ``Asset`` for a queue or its dead letters (what ``Asset.from_uri``-style factories give DAG code)."""
    from airflow.sdk import Asset

    return Asset(uri=asset_uri(babelqueue_conn_id, queue_name, dead_letters=dead_letters), extra=extra or {})


#: Connection type → how its OpenLineage namespace is written (see :func:`lineage_namespace`).
_NAMESPACES = {
    "babelqueue+redis": "redis",
    "babelqueue+rabbitmq": "amqp",
    "babelqueue+sqs": "sqs",
    "babelqueue+servicebus": "servicebus",
    "babelqueue+pulsar": "pulsar",
}


def lineage_namespace(conn_type: str, host: str | None = None, port: int | None = None, schema: str | None = None,
                      extra: Mapping[str, Any] | None = None) -> str:
    """The OpenLineage namespace of a connection's queues: ``redis://host:port``, ``amqp://host:port`` (with
    ``/<vhost>`` after it unless the virtual host is the default ``/``, since equal queue names in two vhosts are
    two queues), ``sqs://<region>`` (``sqs://<endpoint host>`` for an endpoint such as moto),
    ``servicebus://<namespace>``, ``pulsar://host:port``, ``sqlite:<absolute file path>`` or
    ``postgres://host:port/<database>``. Never a password: only the host, port and what names the store."""
    extra = extra or {}
    conn_type = conn_type.replace("babelqueue_", "babelqueue+")
    if conn_type == "babelqueue+sql":
        return _sql_namespace(host, port, schema, extra)
    kind = _NAMESPACES.get(conn_type)
    if kind is None:
        raise ValueError(f"{conn_type!r} is not a BabelQueue connection type")
    if kind == "sqs":
        endpoint = urlsplit(str(extra.get("endpoint_url") or "")).netloc
        return f"sqs://{endpoint or extra.get('region_name') or 'aws'}"
    if kind == "servicebus":
        return f"servicebus://{host or 'servicebus'}"
    default_port = {"redis": 6379, "amqp": 5672, "pulsar": 6650}[kind]
    namespace = f"{kind}://{host or 'localhost'}:{port or default_port}"
    if kind == "amqp" and schema and schema != "/":  # the hook's virtual host is the connection's schema
        namespace += "/" + quote(schema, safe="")
    return namespace


def _sql_namespace(host: str | None, port: int | None, schema: str | None, extra: Mapping[str, Any]) -> str:
    """The SQL binding's namespace, from the store the hook opens (``hooks/sql.py``): ``sqlalchemy_url`` when
    given (without its user and password), else the SQLite file (``$AIRFLOW_HOME/babelqueue.sqlite`` by default,
    made absolute as the hook makes it) or the PostgreSQL server and database."""
    from pathlib import Path

    url = str(extra.get("sqlalchemy_url") or "")
    if url:
        parts = urlsplit(url)
        dialect = parts.scheme.split("+", 1)[0]
        if dialect == "sqlite":
            file = unquote(parts.path[1:])  # sqlite:///relative.db, sqlite:////absolute.db
            return f"sqlite:{Path(file).expanduser().resolve()}" if file and file != ":memory:" else "sqlite::memory:"
        database = parts.path.lstrip("/")
        scheme = "postgres" if dialect in ("postgresql", "postgres") else dialect
        port = parts.port or (5432 if scheme == "postgres" else None)
        return (f"{scheme}://{parts.hostname or 'localhost'}" + (f":{port}" if port else "")
                + (f"/{database}" if database else ""))
    if str(extra.get("dialect") or "sqlite") in ("postgresql", "postgres"):
        return f"postgres://{host or 'localhost'}:{port or 5432}" + (f"/{schema}" if schema else "")
    from .hooks import default_sqlite_path

    return f"sqlite:{Path(host or default_sqlite_path()).expanduser().resolve()}"


def connection_namespace(babelqueue_conn_id: str) -> str:
    """The OpenLineage namespace of a connection's queues (:func:`lineage_namespace` of its fields). The embedded
    default needs no connection; a connection that cannot be read falls back to ``babelqueue://<conn id>`` rather
    than failing the task reporting lineage."""
    from airflow.sdk import BaseHook

    try:
        connection = BaseHook.get_connection(babelqueue_conn_id)
        return lineage_namespace(connection.conn_type or "", connection.host, connection.port, connection.schema,
                                 connection.extra_dejson)
    except Exception:  # noqa: BLE001 - lineage must never fail a task
        if babelqueue_conn_id == "babelqueue_default":
            return lineage_namespace("babelqueue+sql")
        return f"{SCHEME}://{babelqueue_conn_id}"


def lineage_identity(uri: str) -> tuple[str, str]:
    """``(namespace, name)`` of a ``babelqueue://`` URI for OpenLineage: its connection's namespace
    (:func:`connection_namespace`) and the queue's name; for the dead letters, the dead-letter queue its binding
    writes (``orders:failed`` on Redis), as the operators' lineage names it, or ``<queue>/dead-letters`` when the
    connection cannot be read."""
    conn_id, queue_name, dead = parse_uri(uri)
    if not dead:
        return connection_namespace(conn_id), queue_name
    try:  # the DLQ as its binding names it, as the operators' lineage names it, so an asset and a task meet
        from .lineage import ConnectionNames

        return ConnectionNames().dead_letter_queues(conn_id, queue_name, written_only=True)[0]
    except Exception:  # noqa: BLE001 - lineage must never fail a task
        return connection_namespace(conn_id), f"{queue_name}/{DEAD_LETTERS}"


def convert_asset_to_openlineage(asset: Any, lineage_context: Any = None) -> Any:
    """The OpenLineage dataset of a ``babelqueue://`` asset (:func:`lineage_identity`); ``None`` when the
    OpenLineage client is not installed (the compat module's placeholder)."""
    from airflow.providers.common.compat.openlineage.facet import Dataset

    namespace, name = lineage_identity(asset.uri)
    return Dataset(namespace=namespace, name=name)
