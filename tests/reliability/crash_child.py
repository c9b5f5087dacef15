"""The process the crash suite kills: a drain, a replay or a consume that SIGKILLs itself at a chosen point.

The crash suite starts it with :func:`start` (a process forked from a fork server that has this module and
the broker clients imported already); ``python -m tests.reliability.crash_child '<json spec>'`` runs one by
hand. The spec names the broker, the operation and
the kill point: ``{"method": "ack_many", "nth": 3, "when": "after"}`` kills the process right after the third
``ack_many`` returned (the broker has settled, nothing after it ran), ``"when": "before"`` right before the
call; ``{"seconds": 0.003}`` kills it that long after the first ``reserve_dead_letters`` call (a Redis drain:
``open_dead_letter_pipeline``), wherever it is then. Owner ``pipeline`` is the Redis drain's
``RedisDeadLetterPipeline`` class (whose ``ack`` only sends: the server may or may not have run it). No Airflow
is imported: the drain, the replay engine and the consumer are the same code the operators run.

A consume (``"op": "consume"``) runs :class:`~airflow_provider_babelqueue.engine.consume.Consumer` in batches on
the spec's ``queue`` with a handler that appends each ``meta.id`` it handles to the ``handled`` file (one line,
written and fsynced before the handler returns: a message handled but not yet acked shows up again when it is
redelivered). Owner ``handler`` is that recorder (``{"owner": "handler", "method": "record", "when": "after"}``
kills inside the handler, the record written, before it returns); a ``seconds`` kill starts at the first
``reserve_many`` (the child connects before it).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.engine import replay as replay_engine
from airflow_provider_babelqueue.engine.consume import Consumer
from airflow_provider_babelqueue.engine.drain import DrainSource, LocalFileSink, drain_dead_letters
from airflow_provider_babelqueue.engine.replay import replayer as replayer_module


def make_binding(spec: dict[str, Any]) -> Binding:
    """A binding from a JSON spec: ``{"kind": "redis" | "rabbitmq" | "sql", "options": {...}}``."""
    kind, options = spec["kind"], dict(spec.get("options") or {})
    if kind == "redis":
        from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig

        return RedisBinding(RedisConfig(**options))
    if kind == "rabbitmq":
        from airflow_provider_babelqueue.bindings.rabbitmq import RabbitMQBinding, RabbitMQConfig

        return RabbitMQBinding(RabbitMQConfig(**options))
    if kind == "sql":
        from airflow_provider_babelqueue.bindings.sql import SqlBinding, SqlConfig

        return SqlBinding(SqlConfig(**options))
    raise ValueError(f"unknown binding kind {kind!r}")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(owner: Any, name: str, nth: int, when: str) -> None:
    """Replace ``owner.name`` with a wrapper that kills the process around its ``nth`` call."""
    original = getattr(owner, name)
    calls = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == nth and when == "before":
            _die()
        result = original(*args, **kwargs)
        if calls[0] == nth and when == "after":
            _die()
        return result

    setattr(owner, name, wrapper)


def arm_timer(owner: Any, name: str, seconds: float) -> None:
    """Start a kill timer at the first call of ``owner.name`` (so start-up time does not count)."""
    original = getattr(owner, name)
    started: list[threading.Timer] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not started:
            started.append(threading.Timer(seconds, _die))
            started[0].start()
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


class Recorder:
    """A handler's durable effect: each handled ``meta.id`` appended to a file as one line, fsynced at once."""

    def __init__(self, path: str | Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(self, envelope: dict[str, Any]) -> None:
        os.write(self.fd, f"{bq.meta_id_of(envelope)}\n".encode())
        os.fsync(self.fd)

    def handlers(self, urn: str) -> dict[str, Any]:
        """The consumer's handler map: ``urn`` → the recorder, looked up at each call (so :func:`arm` reaches it)."""
        return {urn: lambda envelope: self.record(envelope)}

    def close(self) -> None:
        os.close(self.fd)


def consume(binding: Binding, spec: dict[str, Any], recorder: Recorder) -> None:
    """A batched consumer run on ``spec["queue"]`` until the queue is empty, each delivery recorded."""
    Consumer(binding, spec["queue"], recorder.handlers(spec["urn"]), batch_size=spec["batch"]).run(
        reserve_timeout=spec.get("reserve_timeout", 0.05))


def main(spec: dict[str, Any]) -> int:
    binding = make_binding(spec["binding"])
    kill, op = spec["kill"], spec["op"]
    sink = LocalFileSink(spec["staging"]) if op == "drain" else None
    recorder = Recorder(spec["handled"]) if op == "consume" else None
    pipelined = op == "drain" and spec["binding"]["kind"] == "redis"
    if recorder is not None:  # connect first: a consume's timer counts from its first reserve_many, not the connect
        binding.depth(spec["queue"])
    if "seconds" in kill:
        first = "open_dead_letter_pipeline" if pipelined else "reserve_dead_letters"
        arm_timer(binding, "reserve_many" if recorder is not None else first, kill["seconds"])
    else:
        # "engine" kill points patch the functions the replayer calls (remember_many, ...), where it looks them up
        owners = {"binding": binding, "sink": sink, "engine": replayer_module, "handler": recorder}
        if pipelined:  # the drain reserves and acks through the pipeline's methods (armed on its class)
            from airflow_provider_babelqueue.bindings.redis.pipeline import RedisDeadLetterPipeline

            owners["pipeline"] = RedisDeadLetterPipeline
        arm(owners[kill["owner"]], kill["method"], kill["nth"], kill["when"])
    if recorder is not None:
        consume(binding, spec, recorder)
    elif op == "drain":
        drain_dead_letters([DrainSource(binding, spec["queue"], "crash")], sink, mode="move",
                           batch_records=spec["batch"])
    else:
        ledger = make_binding(spec["ledger"]) if spec.get("ledger") else binding
        replayer = replay_engine.Replayer(target=binding, ledger_binding=ledger, ledger_name=spec["ledger_name"],
                                          target_queue_name=spec["target"], source=binding,
                                          batch_size=spec["batch"])
        try:
            replay_engine.feed_from_dead_letters(replayer, binding, spec["queue"], 0.0)
            replayer.finish()
        except BaseException:
            replayer.abort()
            raise
    print(json.dumps({"finished": True}))
    sys.stdout.flush()
    os._exit(0)  # a finished run skips interpreter teardown, as a killed one would


def _run(spec: dict[str, Any], error_file: str) -> None:
    try:
        main(spec)
    except BaseException:  # the test reports it: the child's stderr belongs to the fork server
        Path(error_file).write_text(traceback.format_exc())
        os._exit(1)


#: Children fork from one server process that imported the drain, the replay engine and the broker clients once:
#: a start costs milliseconds instead of the second those imports take. A fork of a single-threaded server
#: is a process of its own, so SIGKILL drops its sockets and files exactly as it does for an exec'd one.
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload([__name__, "airflow_provider_babelqueue.bindings.redis",
                                 "airflow_provider_babelqueue.bindings.rabbitmq",
                                 "airflow_provider_babelqueue.bindings.sql",
                                 "airflow_provider_babelqueue.bindings.sql.stores",
                                 "airflow_provider_babelqueue.bindings.redis.stores",
                                 # the clients the bindings import when one is made (redis alone takes 0.5 s)
                                 "redis", "pika", "sqlite3", "psycopg2"])


def start(spec: dict[str, Any], error_file: Path, timeout: float = 120) -> tuple[int, str]:
    """Run one child to its end; returns (exit code: ``-9`` when it killed itself, its error text if any)."""
    process = _CONTEXT.Process(target=_run, args=(spec, str(error_file)), daemon=True)
    process.start()
    process.join(timeout)
    if process.exitcode is None:
        process.kill()
        process.join()
        raise TimeoutError(f"crash child still running after {timeout} s: {spec}")
    return process.exitcode, error_file.read_text() if error_file.exists() else ""


if __name__ == "__main__":
    raise SystemExit(main(json.loads(sys.argv[1])))
