"""Redis-specific behaviour of the Redis binding, against a real server (the contract suite covers the rest).

Every test uses its own queue name; the ``queue`` fixture deletes every key containing it afterwards (also
the prefixed ones), so the shared server is never flushed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import BindingError, PublishBatchError
from airflow_provider_babelqueue.bindings.message import ReceivedMessage
from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig
from tests.bindings.conftest import REDIS_URL, kept  # noqa: E402
from tests.conftest import ROOT, compact, conformance_manifest, fixture_dict, free_port

BASE = RedisConfig.from_url(REDIS_URL)
MEMBER = re.compile(rb"^[0-9a-f]{32}:", re.ASCII)

Make = Callable[..., RedisBinding]


@pytest.fixture
def make(rc: Any) -> Iterator[Make]:
    made: list[RedisBinding] = []

    def factory(**options: Any) -> RedisBinding:
        fields = {"host": BASE.host, "port": BASE.port, "db": BASE.db, **options}
        made.append(RedisBinding(RedisConfig(**fields)))
        return made[-1]

    yield factory
    for binding in made:
        binding.close()


def body_for(queue: str, n: int = 0) -> bytes:
    return bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": n, "note": "Café ☕"}, queue_name=queue))


def must(message: ReceivedMessage | None) -> ReceivedMessage:
    assert message is not None, "expected a message"
    return message


def server_now(rc: Any) -> float:
    seconds, micros = rc.time()
    return seconds + micros / 1e6


def test_key_layout_is_the_sdk_legacy_layout(make: Make, rc: Any, queue: str) -> None:
    binding = make(visibility_timeout=30)
    body = body_for(queue)
    binding.publish(body, queue)
    assert rc.type(queue) == b"list" and rc.lrange(queue, 0, -1) == [body]  # the bare queue name, no wrapping
    message = must(binding.reserve(queue))
    assert message.body == body and message.headers == {} and message.delivery_count is None
    assert rc.llen(queue) == 0 and rc.lrange(f"{queue}:processing", 0, -1) == [body]
    [(member, deadline)] = rc.zrange(f"{queue}:processing:deadlines", 0, -1, withscores=True)
    assert MEMBER.match(member) and member[33:] == body
    assert member[:32].decode() == message.receipt.token
    assert abs(deadline - (server_now(rc) + 30)) < 2
    binding.ack(message)
    assert sorted(rc.scan_iter(match=f"*{queue}*")) == []


def test_dead_letter_key_is_queue_failed_or_the_configured_suffix(make: Make, rc: Any, queue: str) -> None:
    for suffix, binding in ((":failed", make()), (".dlq", make(dead_letter_suffix=".dlq"))):
        assert binding.dead_letter_name(queue) == f"{queue}{suffix}"
        body = body_for(queue)
        binding.publish(body, queue)
        binding.dead_letter(must(binding.reserve(queue)), "failed", error="boom")
        [stored] = rc.lrange(f"{queue}{suffix}", 0, -1)
        annotated = bq.decode(stored)
        assert annotated["dead_letter"]["reason"] == "failed" and annotated["dead_letter"]["error"] == "boom"
        assert annotated["meta"] == bq.decode(body)["meta"]
        assert binding.dead_letter_depth(queue) == 1 and rc.llen(queue) == 0
        assert not rc.exists(f"{queue}:processing", f"{queue}:processing:deadlines")
        rc.delete(f"{queue}{suffix}")


def test_conformance_redis_payload_identity(make: Make, rc: Any, queue: str) -> None:
    block = conformance_manifest()["redis"]["payload_identity"]
    body = compact(fixture_dict(block["envelope_file"]))
    binding = make()
    binding.publish(body, queue)
    assert rc.lindex(queue, 0) == body
    message = must(binding.reserve(queue))
    assert message.body == body and message.envelope == fixture_dict(block["envelope_file"])
    assert rc.lindex(f"{queue}:processing", 0) == body
    binding.ack(message)


def test_reaper_requeues_an_abandoned_reservation_at_the_end(make: Make, rc: Any, queue: str) -> None:
    binding = make(visibility_timeout=0.5)
    first, second = body_for(queue, 1), body_for(queue, 2)
    binding.publish(first, queue)
    abandoned = must(binding.reserve(queue))  # its consumer "dies": never settled
    binding.publish(second, queue)
    time.sleep(0.7)
    assert binding.depth(queue) == 2 and rc.lrange(queue, 0, -1) == [second, first]  # back at the END
    assert must(binding.reserve(queue)).body == second
    again = must(binding.reserve(queue))
    assert again.body == first and again.receipt.token != abandoned.receipt.token
    binding.ack(abandoned)  # a late settle of the reclaimed reservation touches nothing
    binding.dead_letter(abandoned, "failed")
    assert rc.lrange(f"{queue}:processing", 0, -1).count(first) == 1 and binding.dead_letter_depth(queue) == 0
    binding.ack(again)
    assert rc.lrange(f"{queue}:processing", 0, -1) == [second]


def test_kill_9_between_reserve_and_ack_loses_nothing(make: Make, rc: Any, queue: str) -> None:
    body = body_for(queue)
    binding = make(visibility_timeout=1.0)
    binding.publish(body, queue)
    child = textwrap.dedent(f"""
        import os, signal, sys
        from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig
        binding = RedisBinding(RedisConfig.from_url({REDIS_URL!r}, visibility_timeout=1.0))
        message = binding.reserve({queue!r})
        sys.stdout.write(message.body.hex())
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", child], cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    assert bytes.fromhex(done.stdout.decode()) == body
    assert rc.llen(queue) == 0 and rc.lrange(f"{queue}:processing", 0, -1) == [body]
    assert binding.reserve(queue) is None  # still reserved by the dead consumer
    recovered = must(binding.reserve(queue, timeout=5))
    assert recovered.body == body and recovered.attempts == 0
    binding.ack(recovered)
    assert not rc.exists(queue, f"{queue}:processing", f"{queue}:processing:deadlines")


def test_delayed_items_stay_out_of_the_ready_list_until_due(make: Make, rc: Any, queue: str) -> None:
    binding = make()
    body = body_for(queue)
    binding.publish(body, queue, delay=1.0)
    binding.publish(body, queue, delay=1.0)  # an identical body is kept apart by its token
    members = rc.zrange(f"{queue}:delayed", 0, -1)
    assert len(members) == 2 and all(MEMBER.match(m) and m[33:] == body for m in members)
    assert rc.llen(queue) == 0 and rc.lpop(queue) is None  # what any other SDK's consumer sees
    assert binding.depth(queue) == 0 and binding.reserve(queue) is None
    time.sleep(1.2)
    assert binding.depth(queue) == 2 and rc.lrange(queue, 0, -1) == [body, body]
    assert not rc.exists(f"{queue}:delayed")


def test_release_and_dlq_drain(make: Make, rc: Any, queue: str) -> None:
    binding = make()
    first, second = body_for(queue, 1), body_for(queue, 2)
    binding.publish_batch([first, second], queue)
    binding.release(must(binding.reserve(queue)))
    bumped = rc.lrange(queue, 0, -1)
    assert bumped[0] == second and bq.decode(bumped[1])["attempts"] == 1  # released to the END, attempts + 1
    binding.release(must(binding.reserve(queue)), delay=30)
    assert rc.llen(queue) == 1 and rc.zcard(f"{queue}:delayed") == 1
    binding.dead_letter(must(binding.reserve(queue)), "failed")
    [stored] = rc.lrange(f"{queue}:failed", 0, -1)
    drained = must(binding.reserve_dead_letter(queue))
    assert drained.from_dead_letter and drained.body == stored and drained.queue_name == queue
    assert rc.lrange(f"{queue}:failed:processing", 0, -1) == [stored] and binding.dead_letter_depth(queue) == 0
    binding.release(drained)  # back on the DLQ unchanged
    assert rc.lrange(f"{queue}:failed", 0, -1) == [stored]
    assert [m.body for m in binding.browse_dead_letters(queue)] == [stored] and binding.dead_letter_depth(queue) == 1
    binding.ack(must(binding.reserve_dead_letter(queue)))
    assert binding.dead_letter_depth(queue) == 0 and not rc.exists(f"{queue}:failed:processing:deadlines")


def test_concurrent_consumers_get_each_message_exactly_once(make: Make, rc: Any, queue: str) -> None:
    binding = make()
    bodies = [body_for(queue, n) for n in range(300)]
    seen: list[bytes] = []
    lock = threading.Lock()

    def consume() -> None:
        idle = 0
        while idle < 3:
            message = binding.reserve(queue, timeout=0.3)  # blocking path: BLMOVE, then the claim script
            if message is None:
                idle += 1
                continue
            idle = 0
            with lock:
                seen.append(message.body)
            binding.ack(message)

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for thread in threads:
        thread.start()
    for start in range(0, 300, 50):  # published while consumers wait, so both reserve paths are used
        binding.publish_batch(bodies[start:start + 25], queue)
        for body in bodies[start + 25:start + 50]:
            binding.publish(body, queue)
        time.sleep(0.05)
    for thread in threads:
        thread.join(timeout=60)
    assert Counter(seen) == Counter(bodies)
    assert not rc.exists(queue, f"{queue}:processing", f"{queue}:processing:deadlines")


def test_orphan_from_a_crash_between_blmove_and_claim_is_adopted(make: Make, rc: Any, queue: str) -> None:
    binding = make(visibility_timeout=0.5)
    body = body_for(queue)
    rc.rpush(queue, body)
    rc.lmove(queue, f"{queue}:processing", "LEFT", "RIGHT")  # BLMOVE done, consumer died before its claim
    assert binding.depth(queue) == 0
    assert rc.zrange(f"{queue}:processing:deadlines", 0, -1) == [b"0" * 32 + b":" + body]
    assert binding.reserve(queue) is None
    time.sleep(0.7)
    recovered = must(binding.reserve(queue))
    assert recovered.body == body
    binding.ack(recovered)
    assert not rc.exists(queue, f"{queue}:processing", f"{queue}:processing:deadlines")


def test_blocking_reserve_wakes_up_on_publish(make: Make, rc: Any, queue: str) -> None:
    binding = make()
    body = body_for(queue)
    timer = threading.Timer(0.3, binding.publish, args=(body, queue))
    timer.start()
    started = time.monotonic()
    message = must(binding.reserve(queue, timeout=5))
    assert message.body == body and time.monotonic() - started < 2
    assert rc.zrange(f"{queue}:processing:deadlines", 0, -1) == [message.receipt.token.encode() + b":" + body]
    binding.ack(message)
    timer.join()


def test_poison_bytes_survive_byte_exact(make: Make, rc: Any, queue: str) -> None:
    binding = make()
    poison = b'\xff\xfe{"job": not json\x00'
    binding.publish(poison, queue)
    message = must(binding.reserve(queue))
    assert message.body == poison and message.envelope is None and message.decode_error
    binding.dead_letter(message, "poison")
    [stored] = rc.lrange(f"{queue}:failed", 0, -1)
    assert kept(stored) == poison  # byte for byte, in a poison wrapper with the reason beside it


def test_publish_batch_uses_chunks_and_reports_failures(make: Make, rc: Any, queue: str) -> None:
    binding = make()
    bodies = [b"m-%d" % n for n in range(2500)]
    binding.publish_batch(bodies, queue)
    assert rc.lrange(queue, 0, -1) == bodies
    rc.set(f"{queue}-str", b"not a list")
    with pytest.raises(PublishBatchError) as caught:
        binding.publish_batch(bodies[:3], f"{queue}-str")
    assert caught.value.failed == [0, 1, 2] and "another data type" in str(caught.value)


def test_key_prefix_isolates_environments(make: Make, rc: Any, queue: str) -> None:
    one, two, bare = make(key_prefix=f"bqtest-a:{queue}:"), make(key_prefix=f"bqtest-b:{queue}:"), make()
    body = body_for(queue)
    one.publish(body, queue)
    one.publish(body, queue, delay=30)
    assert rc.lrange(f"bqtest-a:{queue}:{queue}", 0, -1) == [body] and not rc.exists(queue)
    assert two.depth(queue) == 0 and bare.depth(queue) == 0 and two.reserve(queue) is None
    message = must(one.reserve(queue))
    assert rc.exists(f"bqtest-a:{queue}:{queue}:processing", f"bqtest-a:{queue}:{queue}:delayed") == 2
    one.dead_letter(message, "failed")
    assert one.dead_letter_name(queue) == f"bqtest-a:{queue}:{queue}:failed"
    assert rc.llen(one.dead_letter_name(queue)) == 1 and two.dead_letter_depth(queue) == 0




def test_unreachable_server_gives_a_clear_binding_error() -> None:
    port = free_port()
    binding = RedisBinding(RedisConfig(port=port, socket_timeout=2))  # constructing does not connect
    with pytest.raises(BindingError) as caught:
        binding.depth("orders")
    assert f"127.0.0.1:{port}" in str(caught.value) and "cannot reach" in str(caught.value)


def test_wrong_credentials_give_a_clear_error_without_the_password(rc: Any) -> None:
    secret = f"pw-{uuid.uuid4().hex}"
    config = RedisConfig(host=BASE.host, port=BASE.port, username=f"bq-nobody-{uuid.uuid4().hex[:8]}", password=secret)
    binding = RedisBinding(config)
    for call in (lambda: binding.publish(b"{}", "orders"), lambda: binding.reserve("orders")):
        with pytest.raises(BindingError) as caught:
            call()
        text = f"{caught.value} {caught.value.__cause__!r} {config!r}"
        assert "authentication failed" in str(caught.value) and f"{BASE.host}:{BASE.port}" in str(caught.value)
        assert secret not in text
    binding.close()


def test_config_from_url() -> None:
    config = RedisConfig.from_url(
        "rediss://app:p%40ss%3Aword@cache.example:6380/3?key_prefix=prod:&dead_letter_suffix=.dlq"
        "&visibility_timeout=30&socket_timeout=none&ssl_ca_certs=/etc/ca.pem", db=4)
    assert (config.host, config.port, config.db, config.username, config.password) == (
        "cache.example", 6380, 4, "app", "p@ss:word")
    assert config.ssl and config.ssl_ca_certs == "/etc/ca.pem" and config.key_prefix == "prod:"
    assert config.dead_letter_suffix == ".dlq" and config.visibility_timeout == 30 and config.socket_timeout is None
    assert "p@ss" not in repr(config)
    assert RedisConfig.from_url("redis://localhost") == RedisConfig(host="localhost")
    for bad in ("http://localhost", "redis://localhost/0?retry=1"):
        with pytest.raises(ValueError):
            RedisConfig.from_url(bad)
    with pytest.raises(ValueError):
        RedisConfig(visibility_timeout=0)


def test_module_imports_without_the_redis_package() -> None:
    child = textwrap.dedent("""
        import sys
        sys.modules["redis"] = None  # as if the extra were not installed
        from airflow_provider_babelqueue.bindings.base import MissingExtraError
        from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig
        try:
            RedisBinding(RedisConfig())
        except MissingExtraError as exc:
            assert "airflow-provider-babelqueue[redis]" in str(exc), exc
        else:
            raise SystemExit("no MissingExtraError")
        """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", child], cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()


# ------------------------------------------------------------------------------------- batch operations


def dead_bodies(binding: RedisBinding, rc: Any, queue: str, count: int) -> list[bytes]:
    """``count`` dead letters straight on the DLQ list (as any SDK leaves them), oldest first."""
    bodies = [bq.encode(bq.annotate_dead_letter(bq.make_envelope("urn:babel:orders:created", {"n": n},
                                                                 queue_name=queue),
                                                "failed", original_queue=queue, attempts=3)) for n in range(count)]
    rc.rpush(binding.dead_letter_name(queue), *bodies)
    return bodies


def test_a_batch_reservation_has_the_single_path_layout(make: Make, rc: Any, queue: str) -> None:
    binding = make(visibility_timeout=30)
    bodies = dead_bodies(binding, rc, queue, 5)
    dlq = binding.dead_letter_name(queue)
    batch = binding.reserve_dead_letters(queue, 3)
    assert [m.body for m in batch] == bodies[:3] and rc.lrange(dlq, 0, -1) == bodies[3:]
    assert rc.lrange(f"{dlq}:processing", 0, -1) == bodies[:3]  # what three LMOVEs leave
    members = rc.zrange(f"{dlq}:processing:deadlines", 0, -1, withscores=True)
    assert sorted(m[33:] for m, _ in members) == sorted(bodies[:3]) and all(MEMBER.match(m) for m, _ in members)
    tokens = {m[:32].decode() for m, _ in members}
    assert tokens == {m.receipt.token for m in batch} and len(tokens) == 3  # one reservation each
    assert all(abs(score - (server_now(rc) + 30)) < 2 for _, score in members)
    binding.ack(batch[1])  # a batch member settles alone too
    binding.ack_many([batch[0], batch[2]])  # no longer the head in order: the per-member path
    assert not rc.exists(f"{dlq}:processing", f"{dlq}:processing:deadlines")
    rest = binding.reserve_dead_letters(queue, 10)
    assert [m.body for m in rest] == bodies[3:]
    binding.ack_many(rest)  # the head in reservation order: the fast path
    assert sorted(rc.scan_iter(match=f"*{queue}*")) == []


def test_an_expired_batch_is_swept_back_in_order_and_a_late_ack_is_ignored(make: Make, rc: Any, queue: str) -> None:
    binding = make(visibility_timeout=0.5)
    bodies = dead_bodies(binding, rc, queue, 4)
    dlq = binding.dead_letter_name(queue)
    stale = binding.reserve_dead_letters(queue, 10)
    time.sleep(0.7)
    assert binding.dead_letter_depth(queue) == 4 and rc.lrange(dlq, 0, -1) == bodies  # back, in order
    current = binding.reserve_dead_letters(queue, 2)
    binding.ack_many(stale)  # gated per member: touches neither the DLQ nor the new reservations
    assert rc.lrange(dlq, 0, -1) == bodies[2:] and rc.lrange(f"{dlq}:processing", 0, -1) == bodies[:2]
    assert rc.zcard(f"{dlq}:processing:deadlines") == 2
    binding.release_many(current)  # a DLQ release: back on the DLQ exactly as stored
    assert rc.lrange(dlq, 0, -1) == bodies[2:] + bodies[:2]
    binding.ack_many(binding.reserve_dead_letters(queue, 10))
    assert sorted(rc.scan_iter(match=f"*{queue}*")) == []


def test_release_many_of_ready_messages_bumps_attempts_and_delays(make: Make, rc: Any, queue: str) -> None:
    binding = make()
    bodies = [body_for(queue, n) for n in range(3)]
    binding.publish_batch(bodies, queue)
    held = [must(binding.reserve(queue)) for _ in bodies]
    binding.release_many(held[:2])
    binding.release_many(held[2:], delay=30)
    assert [bq.decode(b)["attempts"] for b in rc.lrange(queue, 0, -1)] == [1, 1]
    [member] = rc.zrange(f"{queue}:delayed", 0, -1)
    assert MEMBER.match(member) and bq.decode(member[33:])["attempts"] == 1
    assert not rc.exists(f"{queue}:processing", f"{queue}:processing:deadlines")


def test_a_kill_9_after_a_batch_reserve_loses_nothing(make: Make, rc: Any, queue: str) -> None:
    binding = make(visibility_timeout=1.0)
    bodies = dead_bodies(binding, rc, queue, 50)
    child = textwrap.dedent(f"""
        import os, signal, sys
        from airflow_provider_babelqueue.bindings.redis import RedisBinding, RedisConfig
        binding = RedisBinding(RedisConfig.from_url({REDIS_URL!r}, visibility_timeout=1.0))
        batch = binding.reserve_dead_letters({queue!r}, 30)
        sys.stdout.write(str(len(batch)))
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", child], cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL and done.stdout == b"30", done.stderr.decode()
    others = binding.reserve_dead_letters(queue, 100)  # the rest; the dead drain's 30 are still reserved
    assert [m.body for m in others] == bodies[30:]
    binding.ack_many(others)
    time.sleep(1.2)
    recovered = binding.reserve_dead_letters(queue, 100)
    assert [m.body for m in recovered] == bodies[:30]  # the dead drain's batch, in order
    binding.ack_many(recovered)
    assert binding.dead_letter_depth(queue) == 0


def test_a_pipelined_batch_has_the_batch_layout_and_acks_in_flight(make: Make, rc: Any, queue: str) -> None:
    binding = make(visibility_timeout=30)
    bodies = dead_bodies(binding, rc, queue, 7)
    dlq = binding.dead_letter_name(queue)
    pipeline = binding.open_dead_letter_pipeline(queue)
    assert pipeline.request(3) == 3 and pipeline.request(10) == 10 and pipeline.reservations_in_flight == 2
    first, second = pipeline.receive(), pipeline.receive()
    assert first.raws == bodies[:3] and first.requested == 3 and second.raws == bodies[3:] and len(second) == 4
    assert rc.llen(dlq) == 0 and rc.lrange(f"{dlq}:processing", 0, -1) == bodies  # both batches held
    members = rc.zrange(f"{dlq}:processing:deadlines", 0, -1)
    expected = [f"{batch.stem}{i:08x}:".encode() + body for batch, part in ((first, bodies[:3]), (second, bodies[3:]))
                for i, body in enumerate(part, 1)]  # the single path's '<token>:<raw>', one token each
    assert sorted(members) == sorted(expected)
    assert [m[:32].decode() for m in expected] == [r.token for r in first.receipts(0, 3) + second.receipts(0, 4)]
    assert [m.receipt.token for m in first.messages()] == [r.token for r in first.receipts(0, 3)]
    assert second.tokens(1, 4) == "".join(r.token for r in second.receipts(1, 4)) and second.tokens(2, 2) == ""
    assert [m.body for m in second.messages(1, 3)] == bodies[4:6]
    pipeline.ack(first, 0, 2)  # sent, not waited for: two acks in flight on the connection
    pipeline.ack(first, 2, 3)
    pipeline.ack(second, 0, 4)
    assert pipeline.request(5) == 5  # the DLQ is empty: an empty batch, once the acks' replies are read
    empty = pipeline.receive()
    assert empty.raws == [] and empty.requested == 5
    pipeline.finish()
    assert sorted(rc.scan_iter(match=f"*{queue}*")) == []


def test_a_refused_pipelined_ack_settles_each_held_reservation(make: Make, rc: Any, queue: str) -> None:
    binding = make(visibility_timeout=30)
    bodies = dead_bodies(binding, rc, queue, 4)
    dlq = binding.dead_letter_name(queue)
    pipeline = binding.open_dead_letter_pipeline(queue)
    pipeline.request(4)
    batch = pipeline.receive()
    gone = f"{batch.stem}{2:08x}:".encode() + bodies[1]  # reservation 2 expires and is swept back (as _MAINTAIN)
    assert rc.zrem(f"{dlq}:processing:deadlines", gone) == 1 and rc.lrem(f"{dlq}:processing", 1, bodies[1]) == 1
    rc.rpush(dlq, bodies[1])
    pipeline.ack(batch, 0, 4)  # not the head in order any more: refused, then settled member by member
    pipeline.finish()
    assert rc.lrange(dlq, 0, -1) == [bodies[1]]  # the swept one stays in the DLQ, the three held ones are gone
    assert not rc.exists(f"{dlq}:processing", f"{dlq}:processing:deadlines")


def test_a_pipeline_abort_hands_back_every_unconfirmed_reservation(make: Make, rc: Any, queue: str) -> None:
    binding = make(visibility_timeout=30)
    bodies = dead_bodies(binding, rc, queue, 9)
    dlq = binding.dead_letter_name(queue)
    pipeline = binding.open_dead_letter_pipeline(queue)
    pipeline.request(3)
    first = pipeline.receive()
    pipeline.request(3)
    pipeline.ack(first, 0, 1)  # in flight when the drain fails: its reply is read, it settled
    pipeline.request(3)
    held = pipeline.abort()
    assert [m.body for m in held] == bodies[3:9]  # the two batches reserved ahead, never received
    assert all(m.from_dead_letter and m.queue_name == queue for m in held)
    binding.release_many(held + first.messages(1, 3))
    assert rc.lrange(dlq, 0, -1) == bodies[3:9] + bodies[1:3]  # back at once, no visibility timeout to wait
    assert not rc.exists(f"{dlq}:processing", f"{dlq}:processing:deadlines")
    with pytest.raises(BindingError, match="closed"):
        pipeline.request(1)


def test_finishing_a_pipeline_releases_a_batch_never_received(make: Make, rc: Any, queue: str) -> None:
    binding = make(visibility_timeout=30)
    bodies = dead_bodies(binding, rc, queue, 5)
    pipeline = binding.open_dead_letter_pipeline(queue)
    pipeline.request(2)
    pipeline.finish()
    assert rc.lrange(binding.dead_letter_name(queue), 0, -1) == bodies[2:] + bodies[:2]
    assert binding.dead_letter_depth(queue) == 5 and rc.zcard(f"{binding.dead_letter_name(queue)}:processing:"
                                                               "deadlines") == 0


def test_seen_store_batches_use_one_set(make: Make, rc: Any, queue: str) -> None:
    binding = make(key_prefix=f"{queue}:")
    store = binding.seen_store("ledger")
    store.remember_many([f"k{i}" for i in range(6000)])  # more than one SADD chunk
    assert rc.scard(f"{queue}:babelqueue:seen:ledger") == 6000
    assert store.seen_many(["k0", "k5999", "k6000"]) == {"k0", "k5999"}
