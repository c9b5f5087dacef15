"""The process the crash suite kills: a drain or a replay that SIGKILLs itself at a chosen point.

The crash suite starts it with :func:`start` (a process forked from a fork server that has this module and
the broker clients imported already); ``python -m tests.reliability.crash_child '<json spec>'`` runs one by
hand. The spec names the broker, the operation and
the kill point: ``{"method": "ack_many", "nth": 3, "when": "after"}`` kills the process right after the third
``ack_many`` returned (the broker has settled, nothing after it ran), ``"when": "before"`` right before the
call; ``{"seconds": 0.003}`` kills it that long after the first ``reserve_dead_letters`` call (a Redis drain:
``open_dead_letter_pipeline``), wherever it is then. Owner ``pipeline`` is the Redis drain's
``RedisDeadLetterPipeline`` class (whose ``ack`` only sends: the server may or may not have run it). No Airflow
is imported: the drain and the replay engine are the same code the operators run.
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

from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.engine import replay as replay_engine
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


def main(spec: dict[str, Any]) -> int:
    binding = make_binding(spec["binding"])
    kill = spec["kill"]
    sink = LocalFileSink(spec["staging"]) if spec["op"] == "drain" else None
    pipelined = spec["op"] == "drain" and spec["binding"]["kind"] == "redis"
    if "seconds" in kill:
        arm_timer(binding, "open_dead_letter_pipeline" if pipelined else "reserve_dead_letters", kill["seconds"])
    else:
        # "engine" kill points patch the functions the replayer calls (remember_many, ...), where it looks them up
        owners = {"binding": binding, "sink": sink, "engine": replayer_module}
        if pipelined:  # the drain reserves and acks through the pipeline's methods (armed on its class)
            from airflow_provider_babelqueue.bindings.redis.pipeline import RedisDeadLetterPipeline

            owners["pipeline"] = RedisDeadLetterPipeline
        arm(owners[kill["owner"]], kill["method"], kill["nth"], kill["when"])
    if spec["op"] == "drain":
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
                                 "airflow_provider_babelqueue.bindings.redis.stores"])


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
