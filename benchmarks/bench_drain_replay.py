"""Dead-letter drain and replay throughput on Redis, against raw redis-py baselines in the same run.

* Drain, ``move`` mode (reserve 1000 dead letters in one script, write, fsync, then ack the 1000 in one
  script): the pure ``drain_dead_letters`` function on a Redis DLQ of ``--n`` dead letters, into a local JSONL
  file. On Redis it is pipelined: the next batch's reservation is sent before this batch is written, the fsync
  runs on a thread while the next batch's records are built, and acks are sent without waiting.
  Also printed: the CPU the drain's Python process and the Redis server's main thread spent per message
  (``process_time`` and ``INFO cpu``), which a busy machine inflates far less than the wall time: on a quiet
  2-core machine the two run in parallel, so the larger of the two bounds the rate.
* Drain, ``browse`` mode (LRANGE windows, nothing removed), same DLQ.
* Raw baselines: (a) LRANGE in 10k chunks + write the same bytes (one body per line) + one fsync + DEL: the
  fastest possible copy, with no at-least-once protocol; (b) the bare reliable drain, LMOVE + write + LREM
  per message, fsync per 1000: the same round trips as ``move`` without our bookkeeping.
* Drain loop alone: ``drain_dead_letters`` over a zero-cost in-process binding (records + writes + fsync),
  i.e. the cost the drain logic adds on top of the broker.
* Replay: the drained JSONL as a replay set into Redis (cut to ``--replay-n`` records, or topped up to it with the
  records of more dead letters), ledger on (Redis seen-sets), one run: per batch of 500 one SMISMEMBER, then one
  RPUSH and two SADDs in one MULTI/EXEC. Against a raw baseline in the same run: the same file read line by line,
  each body reset with bare orjson (loads, drop ``dead_letter``, ``attempts`` 0, dumps) and one pipelined RPUSH +
  SADD of the ``meta.id`` values per 500, no ledger lookup. Printed for both: client (``process_time``) and
  ``redis-server`` CPU per message. The replay's round trips are serial (each batch waits for its reply), so its
  wall time is about the sum of the two, and the larger one bounds the rate. Also printed: how ours splits its
  client CPU (the feed alone and the envelope work alone, re-run over the same file) and the wall time spent
  inside its Redis calls (lookups and publish transactions, redis-py included).

Run: ``make bench`` or ``.venv/bin/python benchmarks/bench_drain_replay.py [--n 100000] [--replay-n 100000]``
(``--n 20000 --replay-n 100000``: a short drain, a full-size replay).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import orjson
import redis

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.bindings.message import ReceivedMessage, parse_body
from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig
from airflow_provider_babelqueue.core.frames import open_body
from airflow_provider_babelqueue.engine.drain import DrainSource, LocalFileSink, drain_dead_letters
from airflow_provider_babelqueue.engine.replay import Replayer, feed_from_replay_set, iter_replay_set

QUIET = logging.getLogger("bench.quiet")
QUIET.setLevel(logging.WARNING)


def dead_bodies(n: int, queue_name: str) -> list[bytes]:
    out = []
    for i in range(n):
        env = bq.make_envelope("urn:babel:orders:created", {"order_id": i, "amount": 9.9, "sku": "Zoë/42"},
                               queue_name=queue_name)
        out.append(bq.encode(bq.annotate_dead_letter(env, "failed", original_queue=queue_name, attempts=3,
                                                     error="gateway timeout", exception="GatewayTimeout")))
    return out


def fill(client: redis.Redis, key: str, bodies: Sequence[bytes]) -> None:
    client.delete(key)
    for start in range(0, len(bodies), 10_000):
        client.rpush(key, *bodies[start:start + 10_000])


class ListBinding(Binding):
    """A DLQ held in a Python list with O(1) reserve/ack: measures the drain loop, not a broker."""

    name = "list"
    can_browse = True

    def __init__(self, bodies: Sequence[bytes]) -> None:
        self.messages = []
        for body in bodies:
            env, error, attempts = parse_body(body)
            self.messages.append(ReceivedMessage(body, "q", env, error, attempts, from_dead_letter=True))
        self.position = 0

    def reserve_dead_letter(self, queue_name: str, timeout: float = 0) -> ReceivedMessage | None:
        if self.position == len(self.messages):
            return None
        self.position += 1
        return self.messages[self.position - 1]

    def reserve_dead_letters(self, queue_name: str, limit: int, timeout: float = 0) -> list[ReceivedMessage]:
        taken = self.messages[self.position:self.position + limit]
        self.position += len(taken)
        return taken

    def ack_many(self, messages: Sequence[ReceivedMessage]) -> None:
        pass

    def ack(self, message: ReceivedMessage) -> None:
        pass

    def release(self, message: ReceivedMessage, delay: float = 0) -> None:
        pass

    def publish(self, body, queue_name, *, headers=None, delay=0):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def publish_batch(self, bodies, queue_name):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def reserve(self, queue_name, timeout=0):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def dead_letter(self, message, reason, *, error=None, exception=None):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def depth(self, queue_name):  # type: ignore[no-untyped-def]
        return 0

    def dead_letter_depth(self, queue_name):  # type: ignore[no-untyped-def]
        return len(self.messages) - self.position


def redis_cpu(client: redis.Redis) -> float:
    """Seconds of CPU the Redis server's main thread has used (``INFO cpu``), for per-message costs."""
    info = client.info("cpu")
    return float(info.get("used_cpu_user_main_thread", info["used_cpu_user"])) + float(
        info.get("used_cpu_sys_main_thread", info["used_cpu_sys"]))


class Cost:
    """Wall, client CPU (``process_time``) and ``redis-server`` CPU of one timed block."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.wall = self.cpu = self.server = 0.0

    def __enter__(self) -> Cost:
        self.server, self.cpu, self.wall = redis_cpu(self.client), time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu
        self.server = redis_cpu(self.client) - self.server


class CallClock:
    """Adds up the wall and client CPU time spent inside wrapped calls (here: every Redis call of the replay)."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def wrap(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return call(*args, **kwargs)
            finally:
                self.wall += time.perf_counter() - wall
                self.cpu += time.process_time() - cpu
        return timed


class GcClock:
    """The time the cyclic garbage collector paused the process inside the ``with`` block (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def clock_redis_calls(binding: RedisBinding) -> CallClock:
    """Time the replay's Redis calls on ``binding``: ``publish_remembering`` (one MULTI/EXEC per batch) and the
    ledger stores' ``seen_many`` (SMISMEMBER). Instance attributes only; the package code is untouched."""
    clock, seen_store = CallClock(), binding.seen_store

    def timed_store(name: str) -> Any:
        store = seen_store(name)
        store.seen_many = clock.wrap(store.seen_many)  # type: ignore[method-assign]
        return store

    binding.publish_remembering = clock.wrap(binding.publish_remembering)  # type: ignore[method-assign]
    binding.seen_store = timed_store  # type: ignore[method-assign]
    return clock


def raw_replay(client: redis.Redis, replay_set: Path, key: str, ids_key: str, batch: int = 500) -> int:
    """The raw replay baseline: each drain record's body reset with bare orjson (the cheapest correct reset:
    ``dead_letter`` dropped, ``attempts`` 0, the other keys in place) and one pipelined RPUSH + SADD of the
    ``meta.id`` values per ``batch``; no ledger lookup, no checks. Returns the number of messages pushed."""
    loads, dumps = orjson.loads, orjson.dumps
    pipe = client.pipeline(transaction=False)
    bodies: list[bytes] = []
    ids: list[str] = []
    pushed = 0
    with open(replay_set, "rb") as lines:
        for record in lines:
            envelope = loads(loads(record)["body"])
            envelope.pop("dead_letter", None)
            envelope["attempts"] = 0
            bodies.append(dumps(envelope))
            ids.append(envelope["meta"]["id"])
            if len(bodies) == batch:
                pipe.rpush(key, *bodies)
                pipe.sadd(ids_key, *ids)
                pipe.execute()
                pushed += len(bodies)
                bodies, ids = [], []
    if bodies:
        pipe.rpush(key, *bodies)
        pipe.sadd(ids_key, *ids)
        pipe.execute()
        pushed += len(bodies)
    return pushed


def replay_cpu_split(replay_set: Path) -> tuple[float, float]:
    """Client CPU seconds of the replay's two per-record stages, each re-run alone over ``replay_set``: the feed
    (read + parse each line, as ``feed_from_replay_set`` does) and the envelope work (decode the body, reset it,
    check it, re-encode it: ``core/envelope.py``)."""
    path = str(replay_set)
    start = time.process_time()
    for _ in iter_replay_set(path):
        pass
    feed = time.process_time() - start
    start = time.process_time()
    for item in iter_replay_set(path):
        if not isinstance(item, str):
            reset = bq.reset_for_replay(open_body(item.body)[0])
            bq.check(reset)
            bq.encode(reset)
    return feed, time.process_time() - start - feed


def line(label: str, n: int, seconds: float, base: float | None = None) -> None:
    ratio = f"{base / seconds:6.2f}x of raw" if base else ""
    print(f"{label:<46} {n:>8,} msgs {seconds:8.2f} s {n / seconds:>12,.0f} msg/s  {ratio}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100_000, help="dead letters to seed and drain")
    parser.add_argument("--replay-n", type=int, default=100_000,
                        help="records of the replay set to replay: the drained file, cut to this or topped up to it "
                             "with the records of more dead letters")
    args = parser.parse_args()
    n = args.n
    client = redis.Redis(host="127.0.0.1", port=6379)
    prefix = f"bqbench:{uuid.uuid4().hex[:8]}:"
    binding = RedisBinding(RedisConfig(host="127.0.0.1", port=6379, key_prefix=prefix))
    queue_name = "orders"
    dlq = binding.dead_letter_name(queue_name)
    bodies = dead_bodies(n, queue_name)
    work = Path(tempfile.mkdtemp(prefix="bq-bench-drain-"))
    try:
        # Raw baseline (a): LRANGE + write + fsync + DEL.
        fill(client, f"{prefix}raw", bodies)
        start = time.perf_counter()
        fd = os.open(work / "raw.jsonl", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        for first in range(0, n, 10_000):
            chunk = client.lrange(f"{prefix}raw", first, first + 9_999)
            os.write(fd, b"\n".join(chunk) + b"\n")
        os.fsync(fd)
        os.close(fd)
        client.delete(f"{prefix}raw")
        raw_lrange = time.perf_counter() - start

        # Raw baseline (b): LMOVE + write + LREM per message, fsync per 1000.
        fill(client, f"{prefix}raw", bodies)
        start = time.perf_counter()
        fd = os.open(work / "raw-reliable.jsonl", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        held: list[bytes] = []
        while (value := client.lmove(f"{prefix}raw", f"{prefix}raw:processing", "LEFT", "RIGHT")) is not None:
            held.append(value)
            if len(held) == 1000:
                os.write(fd, b"\n".join(held) + b"\n")
                os.fsync(fd)
                for item in held:
                    client.lrem(f"{prefix}raw:processing", 1, item)
                held = []
        os.write(fd, b"\n".join(held) + b"\n")
        os.fsync(fd)
        for item in held:
            client.lrem(f"{prefix}raw:processing", 1, item)
        os.close(fd)
        raw_reliable = time.perf_counter() - start

        # Ours, browse mode.
        fill(client, dlq, bodies)
        start = time.perf_counter()
        browsed = drain_dead_letters([DrainSource(binding, queue_name, "bench")],
                                     LocalFileSink(work / "browse.jsonl"), mode="browse", log=QUIET)
        browse_s = time.perf_counter() - start
        assert browsed.records == n and client.llen(dlq) == n

        # Ours, move mode.
        server_before, cpu_before = redis_cpu(client), time.process_time()
        start = time.perf_counter()
        moved = drain_dead_letters([DrainSource(binding, queue_name, "bench")],
                                   LocalFileSink(work / "move.jsonl"), mode="move", log=QUIET)
        move_s = time.perf_counter() - start
        move_cpu, move_server = time.process_time() - cpu_before, redis_cpu(client) - server_before
        assert moved.records == n and client.llen(dlq) == 0

        # The drain loop alone (zero-cost binding).
        fake = ListBinding(bodies)
        start = time.perf_counter()
        drain_dead_letters([DrainSource(fake, queue_name, "bench")], LocalFileSink(work / "loop.jsonl"), log=QUIET)
        loop_s = time.perf_counter() - start

        # Replay: the drained file into Redis, ledger on.
        replay_set = work / "move.jsonl"
        if args.replay_n != n:  # the drained file cut to --replay-n, or topped up with records of fresh dead letters
            replay_set = work / "replay-set.jsonl"
            with open(work / "move.jsonl", "rb") as src:
                replay_set.write_bytes(b"".join(islice(src, args.replay_n)))
            if args.replay_n > n:
                more = ListBinding(dead_bodies(args.replay_n - n, queue_name))
                drain_dead_letters([DrainSource(more, queue_name, "bench")], LocalFileSink(work / "more.jsonl"),
                                   log=QUIET)
                with open(replay_set, "ab") as out:
                    out.write((work / "more.jsonl").read_bytes())
                del more
        # Raw replay baseline: bare orjson reset, pipelined RPUSH + SADD per 500, no ledger.
        with Cost(client) as raw_replay_cost:
            raw_replayed = raw_replay(client, replay_set, f"{prefix}raw-replay", f"{prefix}raw-replay:ids")

        binding.seen_store("bench-ledger")  # loads the stores module (and SQLAlchemy) outside the timing
        redis_calls = clock_redis_calls(binding)
        replayer = Replayer(target=binding, ledger_binding=binding, ledger_name="bench-ledger", log=QUIET)
        with Cost(client) as replay_cost, GcClock() as replay_gc:
            feed_from_replay_set(replayer, str(replay_set))
            replayer.finish()
        replay_s = replay_cost.wall
        replayed = replayer.result.replayed
        assert replayed == args.replay_n and client.llen(f"{prefix}{queue_name}") == replayed
        assert raw_replayed == replayed
        # the baseline does the same work: byte-identical bodies in the same order
        assert client.lrange(f"{prefix}raw-replay", 0, 99) == client.lrange(f"{prefix}{queue_name}", 0, 99)
        client.delete(f"{prefix}raw-replay", f"{prefix}raw-replay:ids")
        feed_cpu, envelope_cpu = replay_cpu_split(replay_set)

        print(f"Redis DLQ of {n:,} dead letters ({sum(map(len, bodies)) / n:.0f} B each) -> local JSONL")
        line("raw LRANGE + write + fsync + DEL", n, raw_lrange)
        line("raw LMOVE + write + LREM (fsync/1000)", n, raw_reliable)
        line("drain browse (LRANGE windows)", n, browse_s, raw_lrange)
        line("drain move (reserve, fsync/1000, ack; batched)", n, move_s, raw_lrange)
        print(f"{'':<46} move vs raw reliable drain: {raw_reliable / move_s:.2f}x")
        print(f"{'':<46} move CPU per message: drain process {move_cpu / n * 1e6:.2f} us, redis-server "
              f"{move_server / n * 1e6:.2f} us (load {os.getloadavg()[0]:.1f})")
        line("drain loop alone (zero-cost binding)", n, loop_s)
        line("raw replay (orjson reset, RPUSH+SADD pipe/500)", replayed, raw_replay_cost.wall)
        line("replay JSONL -> Redis, Redis ledger on", replayed, replay_s, raw_replay_cost.wall)

        def us(seconds: float) -> str:
            return f"{seconds / replayed * 1e6:.2f} us"

        ours, raw = replay_cost, raw_replay_cost
        print(f"{'':<46} replay per message: ours wall {us(ours.wall)} ~ client CPU {us(ours.cpu)} + redis-server "
              f"{us(ours.server)}; raw wall {us(raw.wall)} ~ client {us(raw.cpu)} + redis-server {us(raw.server)} "
              f"(load {os.getloadavg()[0]:.1f})")
        rest = ours.cpu - feed_cpu - envelope_cpu - redis_calls.cpu - replay_gc.seconds
        bound = "client CPU" if ours.cpu >= ours.server else "redis-server CPU"
        times = ours.cpu / max(ours.server, 1e-9)
        print(f"{'':<46} replay bound: {bound}, {times:.1f}x the server's; ours client CPU: feed "
              f"read+parse {us(feed_cpu)}, decode+reset+check+re-encode {us(envelope_cpu)}, redis-py "
              f"{us(redis_calls.cpu)}, GC {us(replay_gc.seconds)}, engine rest {us(rest)} (per-record checks, "
              f"digest, ledger sets, batching)")
        print(f"{'':<46} replay round trips are serial: wall inside Redis calls {us(redis_calls.wall)} vs "
              f"redis-py {us(redis_calls.cpu)} + redis-server {us(ours.server)} (the client waits while the server "
              f"works)")
    finally:
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
        binding.close()
        client.close()
        for path in work.iterdir():
            path.unlink()
        work.rmdir()


if __name__ == "__main__":
    main()
