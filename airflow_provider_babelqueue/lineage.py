"""OpenLineage at operator level: which queues and files a BabelQueue task run read and wrote.

The operators' ``get_openlineage_facets_on_complete`` (called by the OpenLineage provider's listener once a task
ended, on success and, for want of an ``on_failure`` variant, on failure too) are each a call into this module:

* publish writes its queue; consume reads its queue and writes the queue's dead-letter queue when it dead-lettered
  anything;
* drain reads every dead-letter queue its binding reads for each source and writes the drain file;
* the Spark jobs read their input locations and write their output folder (triage also its report folder);
* replay reads the dead-letter queues (a redrive) or the replay set, and writes each queue it republished to.

A queue is ``(its connection's namespace, the queue name)``, the namespace being the one the ``babelqueue://``
assets use (:func:`~airflow_provider_babelqueue.assets.connection_namespace`), so a DAG's assets and its tasks'
lineage name a queue alike. A dead-letter queue is named as its binding names it (``orders:failed`` on Redis, with
the key prefix; ``orders.failed`` on RabbitMQ; the ``<table>_failed`` table on SQL). A file or folder is named as
OpenLineage's naming spec and its Spark integration name locations: namespace ``file`` and the absolute path;
``s3://bucket`` and the key; ``scheme://authority`` and the path otherwise.

What a run wrote comes from its XCom return value, so a run that failed before returning reports what it reads
and nothing it may or may not have written. Nothing here imports OpenLineage except :func:`to_operator_lineage`,
which returns ``None`` when the OpenLineage provider is not installed (the provider does not depend on it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

__all__ = [
    "ConnectionNames",
    "Identity",
    "Lineage",
    "QueueNames",
    "consume_lineage",
    "drain_lineage",
    "location_identity",
    "publish_lineage",
    "replay_lineage",
    "run_result",
    "spark_lineage",
    "to_operator_lineage",
]

#: An OpenLineage dataset's ``(namespace, name)``.
Identity = tuple[str, str]

#: Object stores whose dataset name is the key (no leading ``/``), and the scheme OpenLineage names each under:
#: Hadoop's ``s3a``/``s3n`` connectors and fsspec's ``gcs`` reach the same buckets as ``s3`` and ``gs``.
_OBJECT_STORES = {"s3": "s3", "s3a": "s3", "s3n": "s3", "gs": "gs", "gcs": "gs", "abfs": "abfs", "abfss": "abfss",
                  "wasb": "wasb", "wasbs": "wasbs"}
_LOCAL_SCHEMES = ("", "file", "local")


@dataclass(frozen=True)
class Lineage:
    """The datasets one task run read (``inputs``) and wrote (``outputs``), each once, in the order met."""

    inputs: tuple[Identity, ...] = ()
    outputs: tuple[Identity, ...] = ()

    @classmethod
    def of(cls, inputs: Iterable[Identity] = (), outputs: Iterable[Identity] = ()) -> Lineage:
        """A lineage with repeated datasets dropped (two sources on one DLQ name it once)."""
        return cls(tuple(dict.fromkeys(inputs)), tuple(dict.fromkeys(outputs)))


class QueueNames(Protocol):
    """How queues are named for lineage; :class:`ConnectionNames` reads Airflow connections, tests may pass a
    stand-in."""

    def queue(self, conn_id: str, queue_name: str) -> Identity:
        """The queue ``queue_name`` on connection ``conn_id``."""
        ...

    def dead_letter_queues(self, conn_id: str, queue_name: str, *, written_only: bool = False) -> list[Identity]:
        """Every dead-letter queue read for ``queue_name`` (the written one first), or only the written one."""
        ...


class ConnectionNames:
    """:class:`QueueNames` from the connections: the namespace of
    :func:`~airflow_provider_babelqueue.assets.connection_namespace`, and dead-letter queue names from the
    connection's binding (``dead_letter_name`` / ``dead_letter_sources``), which is built but not connected, except
    on SQS, where naming the DLQ reads the queue's ``RedrivePolicy``. Each is looked up once per instance."""

    def __init__(self) -> None:
        self._namespaces: dict[str, str] = {}

    def namespace(self, conn_id: str) -> str:
        if conn_id not in self._namespaces:
            from .assets import connection_namespace

            self._namespaces[conn_id] = connection_namespace(conn_id)
        return self._namespaces[conn_id]

    def queue(self, conn_id: str, queue_name: str) -> Identity:
        return self.namespace(conn_id), queue_name

    def dead_letter_queues(self, conn_id: str, queue_name: str, *, written_only: bool = False) -> list[Identity]:
        from .hooks import get_hook

        hook = get_hook(conn_id)
        try:
            binding = hook.get_binding()
            names = [binding.dead_letter_name(queue_name)] if written_only else binding.dead_letter_sources(queue_name)
        finally:
            hook.close()
        namespace = self.namespace(conn_id)
        return [(namespace, name) for name in names]


def location_identity(location: str | os.PathLike[str]) -> Identity:
    """The dataset of a file or folder, named as OpenLineage's naming spec and its Spark integration name it, so
    these datasets meet those of a Spark job reporting lineage itself:

    * a local path or ``file://`` URL: namespace ``file``, name the absolute path without a trailing ``/``
      (``file://<host>`` for a URL that names another host);
    * an object store: namespace ``s3://<bucket>`` (also for ``s3a``/``s3n``, and without the connection id of
      ObjectStoragePath's ``s3://<conn id>@<bucket>`` form), ``gs://<bucket>``, ``abfss://<container>@<account
      host>``...; name the key, without leading or trailing ``/`` (``/`` for the bucket itself);
    * any other URL (``hdfs://namenode:8020/runs``): namespace ``scheme://authority``, name the path.

    A relative local path is made absolute against the current directory, as the task that wrote it used it.
    """
    text = os.fspath(location).strip()
    parts = urlsplit(text)
    scheme = parts.scheme.lower() if len(parts.scheme) > 1 else ""  # "C:" is a drive, not a scheme
    if scheme in _LOCAL_SCHEMES:
        path = unquote(parts.path) if scheme else text
        host = parts.netloc if scheme and parts.netloc not in ("", "localhost") else ""
        absolute = os.path.abspath(os.path.expanduser(path)) if not host else "/" + path.strip("/")
        return (f"file://{host}" if host else "file"), absolute
    if scheme in _OBJECT_STORES:
        store = _OBJECT_STORES[scheme]
        # ``s3://aws_default@bucket/key``: Airflow's ObjectStoragePath form with a connection id, which names no data
        # (a bucket name holds no "@"); Azure's ``container@account`` is the authority itself
        authority = parts.netloc.rpartition("@")[2] if store in ("s3", "gs") else parts.netloc
        return f"{store}://{authority}", unquote(parts.path).strip("/") or "/"
    path = unquote(parts.path)
    return f"{scheme}://{parts.netloc}", (path.rstrip("/") or "/")


def _names(names: QueueNames | None) -> QueueNames:
    return ConnectionNames() if names is None else names


def publish_lineage(conn_id: str, queue_name: str, published: Any, *, names: QueueNames | None = None) -> Lineage:
    """A publish writes its queue, once it returned the ``meta.id`` values it published (``published``, its XCom):
    none published, or no return value (it failed), writes nothing known."""
    if not isinstance(published, Sequence) or isinstance(published, str | bytes) or not published:
        return Lineage()
    return Lineage.of(outputs=[_names(names).queue(conn_id, queue_name)])


def consume_lineage(conn_id: str, queue_name: str, summary: Any, *, names: QueueNames | None = None) -> Lineage:
    """A consumer run reads its queue, and writes the dead-letter queue its binding writes when its summary (its
    XCom, pushed also when ``fail_on_dead_letters`` failed the task) counts a dead letter."""
    queues = _names(names)
    dead = summary.get("dead_lettered") if isinstance(summary, Mapping) else None
    outputs = (queues.dead_letter_queues(conn_id, queue_name, written_only=True)
               if isinstance(dead, Mapping) and any(dead.values()) else [])
    return Lineage.of(inputs=[queues.queue(conn_id, queue_name)], outputs=outputs)


def drain_lineage(sources: Iterable[tuple[str, str]], result: Any, *, names: QueueNames | None = None) -> Lineage:
    """A drain reads every dead-letter queue its binding reads for each ``(conn id, queue)`` source, and writes the
    file its result (its XCom) names as ``path``."""
    queues = _names(names)
    inputs = [dlq for conn_id, queue_name in sources for dlq in queues.dead_letter_queues(conn_id, queue_name)]
    path = result.get("path") if isinstance(result, Mapping) else None
    return Lineage.of(inputs=inputs, outputs=[location_identity(path)] if path else [])


def replay_lineage(*, source_conn_id: str, queue_name: str | None, replay_set: str | None, target_conn_id: str,
                   result: Any, names: QueueNames | None = None) -> Lineage:
    """A replay reads the dead-letter queues of ``queue_name`` on ``source_conn_id`` (a redrive), or else the
    ``replay_set`` file or folder, and writes each queue of its result's ``targets`` on ``target_conn_id``; a dry
    run writes nothing.

    :param queue_name: the rendered ``queue_name``, ``None`` when it was not given or rendered blank.
    :param replay_set: the rendered ``replay_set``, likewise.
    :param result: the replay's XCom (``targets``: queue → messages published, ``dry_run``).
    """
    queues = _names(names)
    if queue_name:
        inputs = queues.dead_letter_queues(source_conn_id, queue_name)
    else:
        inputs = [location_identity(replay_set)] if replay_set else []
    outputs: list[Identity] = []
    if isinstance(result, Mapping) and not result.get("dry_run") and isinstance(result.get("targets"), Mapping):
        outputs = [queues.queue(target_conn_id, str(target)) for target, count in result["targets"].items() if count]
    return Lineage.of(inputs=inputs, outputs=outputs)


def spark_lineage(job: str, inputs: Iterable[str], result: Any, report_output: str | None = None) -> Lineage:
    """A Spark job reads its input locations and writes its output folder (``triage``: the deduplicated Parquet;
    ``report``: ``summary.json`` + ``report.html``; ``replay_set``: the selected drain records), and a triage
    given ``report_output`` also that report folder. The outputs count once the result (its XCom) exists.

    :param inputs: the operator's rendered inputs; the result's ``input`` wins, since it is what was submitted (a
        triage with ``pending`` adds the drain files earlier runs left there).
    """
    submitted = result.get("input") if isinstance(result, Mapping) else None
    if submitted:
        inputs = [submitted] if isinstance(submitted, str) else [str(path) for path in submitted]
    outputs: list[Identity] = []
    if isinstance(result, Mapping) and result.get("output"):
        outputs.append(location_identity(str(result["output"])))
        if job == "triage" and report_output:
            outputs.append(location_identity(report_output))
    return Lineage.of(inputs=[location_identity(path) for path in inputs if path], outputs=outputs)


def run_result(task_instance: Any) -> Any:
    """The XCom return value of the task instance's own run; ``None`` when it has none or it cannot be read
    (lineage never fails a task)."""
    try:
        return task_instance.xcom_pull(task_ids=task_instance.task_id)
    except Exception:  # noqa: BLE001 - lineage must never fail a task
        return None


def to_operator_lineage(lineage: Lineage) -> Any:
    """The OpenLineage provider's ``OperatorLineage`` of ``lineage`` (``openlineage.client.event_v2.Dataset``
    values); ``None`` when OpenLineage is not installed."""
    try:
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.event_v2 import Dataset
    except ImportError:
        return None
    return OperatorLineage(inputs=[Dataset(namespace=namespace, name=name) for namespace, name in lineage.inputs],
                           outputs=[Dataset(namespace=namespace, name=name) for namespace, name in lineage.outputs])
