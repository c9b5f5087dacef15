"""What refusing an oversized body costs in memory (issue #29 point 6: body limits bound memory).

A consumer refuses a body over ``max_body_bytes`` (16 MiB by default) as ``poison``. The binding does not decode
such a body (``Binding.decode_limit``): the SQL table does not even fetch it and copies it into the dead-letter table
inside the database; Redis reads it in slices and sends its poison wrapper in parts. The dead letter keeps its exact
bytes. Per binding (Redis, SQLite file, PostgreSQL), in a fresh child process each so that peaks do not mix:

1. one valid envelope whose ``data`` holds one long ASCII string (``--mb``, default 100 MB) is published with the
   binding; every local reference to it is dropped, ``gc.collect()`` and glibc's ``malloc_trim(0)`` run;
2. the baseline is the resident set then; the peak is the kernel's high-water mark (``VmHWM``, reset by writing
   ``5`` to ``/proc/self/clear_refs``) while ``Consumer(binding, queue, {}).run(max_messages=1,
   reserve_timeout=1)`` runs with the default limits;
3. checked afterwards: dead-lettered as ``poison``, the DLQ holds the exact bytes (Redis: the poison wrapper's
   ``raw``; SQL: the ``payload`` column), the ready queue is empty;
4. the reference, in the same process: what ``orjson.loads(body)`` alone costs (the old path decoded every body
   before its size was checked), measured the same way with the body already in memory.

Printed: binding, body MB, peak − baseline MB, that as a multiple of the body, and as a multiple of the reference.
``--profile`` adds, per case, the peak above entry of the steps of the refusal (reserve, the driver's fetch, the
dead letter's body or parts, the write), measured the same way around each of them.

Run: ``make bench-body-limit`` or ``.venv/bin/python benchmarks/bench_body_limit.py [--mb 100]
[--bindings redis,sqlite,postgresql] [--profile]``. Needs Redis on 127.0.0.1:6379 and PostgreSQL at
``postgresql+psycopg2://postgres@127.0.0.1:5432/test`` (``make services``); Linux (``/proc/self/status``).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: the package and tests/ are importable
    sys.path.insert(0, str(ROOT))

POSTGRES_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
BINDINGS = ("redis", "sqlite", "postgresql")
URN = "urn:babel:bench:oversized"
MB = 1_000_000

# ----------------------------------------------------------------------------------------- memory figures


def _status(field: str) -> int:
    """A ``/proc/self/status`` figure in bytes (``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} is not in /proc/self/status")


def rss() -> int:
    return _status("VmRSS")


def peak() -> int:
    return _status("VmHWM")


def reset_peak() -> None:
    """Reset the high-water mark to the current resident set (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as clear:
        clear.write("5")


def settle() -> None:
    """Free what is unreachable and hand glibc's free heap pages back, so the baseline is memory in use."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def check_peak_reset() -> None:
    """Fail loudly where ``clear_refs`` does not reset the mark (the figures would be lifetime peaks)."""
    block = bytearray(64 * 2**20)
    block[:: 4096] = b"\x01" * len(range(0, len(block), 4096))
    del block
    settle()
    reset_peak()
    if peak() - rss() > 16 * 2**20:
        raise RuntimeError("writing 5 to /proc/self/clear_refs did not reset VmHWM here")


def measured(fn: Callable[[], Any]) -> tuple[Any, int, int]:
    """``(fn(), baseline, peak)``: the resident set before and its high-water mark during ``fn``."""
    settle()
    reset_peak()
    baseline = rss()
    result = fn()
    return result, baseline, max(peak(), baseline)


class Stages:
    """Peak above entry for chosen functions, with nesting: each call resets the mark on entry and on exit and
    passes the mark seen so far on to every enclosing call, so a caller's peak still covers its callees."""

    def __init__(self) -> None:
        self.stack: list[list[int]] = []
        self.rows: dict[str, list[int]] = {}  # label -> [calls, highest peak above entry, kept after]
        self.order: list[str] = []

    def _checkpoint(self) -> None:
        mark = peak()
        for frame in self.stack:
            frame[1] = max(frame[1], mark)
        reset_peak()

    def wrap(self, owner: Any, name: str, label: str | Callable[..., str]) -> None:
        """Measure ``owner.name``; ``label`` may be a function of the call's arguments (one row per label)."""
        original = getattr(owner, name)
        stages = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            shown = label(*args, **kwargs) if callable(label) else label
            stages._checkpoint()
            entry = rss()
            frame = [entry, entry]
            stages.stack.append(frame)
            try:
                return original(*args, **kwargs)
            finally:
                stages._checkpoint()
                stages.stack.pop()
                if shown not in stages.rows:
                    stages.rows[shown] = [0, 0, 0]
                    stages.order.append(f"{'  ' * len(stages.stack)}{shown}")
                row = stages.rows[shown]
                row[0] += 1
                row[1] = max(row[1], frame[1] - entry)
                row[2] += rss() - entry

        setattr(owner, name, wrapper)

    def report(self) -> list[tuple[str, int, int, int]]:
        return [(shown, *self.rows[shown.strip()]) for shown in self.order]


def instrument(kind: str) -> Stages:
    """Wrap the steps of a refusal, outermost first (the consumer's run) down to the driver calls."""
    from airflow_provider_babelqueue.bindings import base
    from airflow_provider_babelqueue.core import peer
    from airflow_provider_babelqueue.engine.consume import Consumer

    stages = Stages()
    stages.wrap(Consumer, "run", "Consumer.run")
    stages.wrap(Consumer, "process", "Consumer.process")
    if kind == "redis":
        import redis.connection

        from airflow_provider_babelqueue.bindings.redis import binding as rb

        stages.wrap(rb.RedisBinding, "reserve", "RedisBinding.reserve")
        stages.wrap(redis.connection.Connection, "read_response", "redis-py Connection.read_response")
        stages.wrap(rb.RedisBinding, "_read_spilled", "RedisBinding._read_spilled (GETRANGE slices)")
        stages.wrap(rb.RedisBinding, "_free_reply_buffer", "RedisBinding._free_reply_buffer (PING)")
        stages.wrap(rb.RedisBinding, "_parsed", "RedisBinding._parsed (parse_body, frame_headers)")
        stages.wrap(rb.RedisBinding, "dead_letter", "RedisBinding.dead_letter")
        stages.wrap(rb, "dead_letter_body", "bodies.dead_letter_body")
        stages.wrap(rb, "dead_letter_parts", "bodies.dead_letter_parts (the wrapper's length)")
        stages.wrap(base, "wrap_raw", "peer.wrap_raw")
        stages.wrap(rb.RedisBinding, "_settle", "RedisBinding._settle (the settle script)")
        stages.wrap(rb.RedisBinding, "_run", "RedisBinding._run (a large command in parts)")
        stages.wrap(redis.connection.Connection, "send_command", "redis-py Connection.send_command")
        if getattr(redis.connection, "HIREDIS_AVAILABLE", False):
            import hiredis

            stages.wrap(hiredis, "pack_command", "hiredis.pack_command")
        stages.wrap(redis.connection.Connection, "send_packed_command", "redis-py send_packed_command")
    else:
        import sqlalchemy.engine.default
        import sqlalchemy.engine.result

        from airflow_provider_babelqueue.bindings.sql import binding as sb

        stages.wrap(sb.SqlBinding, "reserve", "SqlBinding.reserve")
        def statement(dialect: Any, cursor: Any, sql: str, *rest: Any) -> str:
            return f"DBAPI cursor.execute({sql.split(None, 1)[0].upper()})"

        stages.wrap(sqlalchemy.engine.default.DefaultDialect, "do_execute", statement)
        stages.wrap(sqlalchemy.engine.result.Result, "all", "SQLAlchemy Result.all (fetch + row processing)")
        stages.wrap(sb.SqlBinding, "_message", "SqlBinding._message (bytes(row.payload), parse_body)")
        stages.wrap(sb.SqlBinding, "dead_letter", "SqlBinding.dead_letter")
        stages.wrap(sb, "annotated_body", "bodies.annotated_body")
        stages.wrap(sb.SqlBinding, "_move_unread", "SqlBinding._move_unread (INSERT ... SELECT, DELETE)")
    del peer
    return stages


# ----------------------------------------------------------------------------------------------- one case


@contextmanager
def open_binding(kind: str, workdir: Path) -> Iterator[Any]:
    """A fresh binding on its own table / key prefix, removed afterwards."""
    if kind == "redis":
        import redis

        from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig

        prefix = f"bqbench:body:{uuid.uuid4().hex[:8]}:"
        binding = RedisBinding(RedisConfig(host=REDIS_HOST, port=REDIS_PORT, key_prefix=prefix))
        try:
            yield binding
        finally:
            binding.close()
            client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT)
            keys = list(client.scan_iter(match=f"{prefix}*"))
            if keys:
                client.delete(*keys)
            client.close()
        return
    import sqlalchemy as sa

    from airflow_provider_babelqueue.bindings.sql import SqlBinding, SqlConfig, sqlite_url

    url = sqlite_url(workdir / "queue.sqlite") if kind == "sqlite" else POSTGRES_URL
    table = f"bqbench_body_{uuid.uuid4().hex[:8]}"
    binding = SqlBinding(SqlConfig(url=url, table=table))
    try:
        yield binding
    finally:
        binding.close()
        if kind == "postgresql":
            engine = sa.create_engine(url)
            with engine.begin() as conn:
                for name in (table, f"{table}_failed"):
                    conn.execute(sa.text(f'DROP TABLE IF EXISTS "{name}"'))
            engine.dispose()


def build_body(size: int) -> bytes:
    """A valid envelope of about ``size`` bytes: ``data`` holds one ASCII string."""
    from airflow_provider_babelqueue.core import envelope as bq

    overhead = len(bq.encode(bq.make_envelope(URN, {"blob": ""})))
    return bq.encode(bq.make_envelope(URN, {"blob": "x" * max(size - overhead, 0)}))


def stored_dead_letter(kind: str, binding: Any, queue: str) -> tuple[bytes, str]:
    """The exact bytes the DLQ keeps for the one dead letter, and its reason."""
    if kind == "redis":
        from airflow_provider_babelqueue.core.peer import poison_wrapper

        items = binding.client.lrange(binding.dead_letter_name(queue), 0, -1)
        assert len(items) == 1, f"expected one dead letter, found {len(items)}"
        wrapper = poison_wrapper(bytes(items[0]))
        assert wrapper is not None, "the Redis dead letter is not a poison wrapper"
        return wrapper.raw, str(wrapper.dead_letter.get("reason"))
    import sqlalchemy as sa

    engine = sa.create_engine(binding.config.url)
    try:
        failed = sa.Table(f"{binding.config.table}_failed", sa.MetaData(), autoload_with=engine)
        with engine.connect() as conn:
            rows = conn.execute(sa.select(failed.c.payload, failed.c.reason)).all()
    finally:
        engine.dispose()
    assert len(rows) == 1, f"expected one dead-letter row, found {len(rows)}"
    return bytes(rows[0].payload), rows[0].reason


def measure(kind: str, size: int, *, profile: bool = False) -> dict[str, Any]:
    """One case, in this process: publish, refuse, check, then the ``orjson.loads`` reference."""
    import orjson

    from airflow_provider_babelqueue.engine.consume import Consumer

    check_peak_reset()
    queue = "oversized"
    with tempfile.TemporaryDirectory(prefix="bqbench-body-") as tmp, open_binding(kind, Path(tmp)) as binding:
        kept = Path(tmp) / "body.json"  # the body, to compare with the DLQ after the measurement
        body = build_body(size)
        body_len = len(body)
        kept.write_bytes(body)
        binding.publish(body, queue)
        del body
        stages = instrument(kind) if profile else None
        consumer = Consumer(binding, queue, {})

        started = time.perf_counter()
        summary, baseline, top = measured(lambda: consumer.run(max_messages=1, reserve_timeout=1))
        seconds = time.perf_counter() - started

        dead_lettered = dict(summary.dead_lettered)
        assert dead_lettered == {"poison": 1}, f"dead-lettered {dead_lettered}, expected one poison"
        raw, reason = stored_dead_letter(kind, binding, queue)
        exact = raw == kept.read_bytes()
        del raw
        assert exact, "the DLQ does not hold the body's exact bytes"
        assert reason == "poison", f"stored reason {reason!r}"
        ready = binding.depth(queue)
        assert ready == 0, f"the ready queue holds {ready} message(s)"

        decode = partial(orjson.loads, kept.read_bytes())  # the body is in the baseline, as a received one is
        _, ref_baseline, ref_top = measured(decode)
        del decode
    result: dict[str, Any] = {
        "binding": kind, "body_bytes": body_len, "baseline": baseline, "peak": top, "delta": top - baseline,
        "reference_delta": ref_top - ref_baseline, "seconds": seconds, "dead_lettered": dead_lettered,
        "exact_bytes": exact, "ready_depth": ready,
    }
    if stages is not None:
        result["stages"] = stages.report()
    return result


def run_case(kind: str, size: int, *, profile: bool = False, timeout: float = 600) -> dict[str, Any]:
    """:func:`measure` in a fresh Python process (so no peak or freed heap of another case mixes in)."""
    command = [sys.executable, str(HERE), "--child", kind, "--bytes", str(size)] + (["--profile"] if profile else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} case failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------- printing


def print_table(results: list[dict[str, Any]]) -> None:
    header = (f"{'binding':<11} {'body MB':>8} {'peak-base MB':>13} {'x body':>7} {'orjson.loads MB':>16} "
              f"{'x orjson':>9} {'run s':>6}")
    print(header)
    print("-" * len(header))
    for r in results:
        body, delta, ref = r["body_bytes"], r["delta"], r["reference_delta"]
        print(f"{r['binding']:<11} {body / MB:>8.1f} {delta / MB:>13.1f} {delta / body:>6.2f}x {ref / MB:>16.1f} "
              f"{delta / ref if ref else float('nan'):>8.2f}x {r['seconds']:>6.2f}")


def print_stages(result: dict[str, Any]) -> None:
    body = result["body_bytes"]
    print(f"\n{result['binding']}: peak above entry per step (x body), kept after the step")
    for label, calls, top, kept in result["stages"]:
        print(f"  {label:<64} calls {calls:>2}  peak {top / MB:>7.1f} MB ({top / body:4.2f}x)  "
              f"kept {kept / MB:>7.1f} MB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=100.0, help="body size in MB (10^6 bytes); default 100")
    parser.add_argument("--bindings", default=",".join(BINDINGS),
                        help="comma-separated subset of " + ",".join(BINDINGS))
    parser.add_argument("--profile", action="store_true", help="also show the peak of each step of the refusal")
    parser.add_argument("--child", choices=BINDINGS, help=argparse.SUPPRESS)
    parser.add_argument("--bytes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.bytes, profile=args.profile)))
        return 0
    sys.path.insert(0, str(HERE.parent))
    from machine import describe

    print(describe())
    size = int(args.mb * MB)
    kinds = [k.strip() for k in args.bindings.split(",") if k.strip()]
    results = [run_case(kind, size) for kind in kinds]
    print(f"\nRefusing one {size / MB:.0f} MB body (default max_body_bytes 16 MiB); fresh process per binding; "
          "orjson.loads = the same body decoded in the same process")
    print_table(results)
    if args.profile:  # separate runs: the resets around each step would break the headline peak
        for kind in kinds:
            print_stages(run_case(kind, size, profile=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
