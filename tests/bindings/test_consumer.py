"""The consumer's rules on every binding: validation first, unknown URNs, retries, idempotency, bounds."""

from __future__ import annotations

import time
import uuid

import orjson
import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding
from airflow_provider_babelqueue.engine.consume import Backoff, Consumer, UnknownUrnStrategy
from tests.bindings.conftest import kept

URN = "urn:babel:orders:created"
NO_WAIT = Backoff("fixed", 0.0)


class GatewayTimeout(Exception):
    pass


def publish(binding: Binding, queue_name: str, n: int = 1, urn: str = URN) -> list[bytes]:
    bodies = [bq.encode(bq.make_envelope(urn, {"n": i}, queue_name=queue_name)) for i in range(n)]
    for body in bodies:
        binding.publish(body, queue_name)
    return bodies


def drain(binding: Binding, queue_name: str) -> list[dict]:
    out = []
    while (message := binding.reserve_dead_letter(queue_name, timeout=0)) is not None:
        out.append(message.envelope if message.envelope is not None else {"raw": message.body})
        binding.ack(message)
    return out


def test_handled_messages_are_acked(binding: Binding, queue_name: str) -> None:
    publish(binding, queue_name, 3)
    seen: list[int] = []
    summary = Consumer(binding, queue_name, {URN: lambda env: seen.append(env["data"]["n"])}).run(reserve_timeout=0.2)
    assert seen == [0, 1, 2]
    assert summary.as_dict() == {
        "received": 3,
        "handled": 3,
        "retried": 0,
        "skipped_duplicates": 0,
        "deleted_unknown": 0,
        "released_unknown": 0,
        "unmatched": 0,
        "returned_unhandled": 0,
        "broker_errors": 0,
        "results_dropped": 0,
        "results_unserialisable": 0,
        "dead_lettered": {},
    }
    assert binding.depth(queue_name) == 0 and binding.dead_letter_depth(queue_name) == 0


def test_poison_and_invalid_envelopes_are_quarantined_with_their_reason(binding: Binding, queue_name: str) -> None:
    poison = b"\xff not json at all"
    binding.publish(poison, queue_name)
    variants = {
        "unsupported_schema_version": ("meta", "schema_version", 2),
        "missing_trace_id": (None, "trace_id", ""),
        "invalid_data": (None, "data", [1, 2]),
    }
    for container, key, value in variants.values():
        env = bq.make_envelope(URN, {}, queue_name=queue_name)
        (env[container] if container else env)[key] = value
        binding.publish(bq.encode(env), queue_name)
    calls: list[object] = []
    summary = Consumer(binding, queue_name, {URN: calls.append}).run(reserve_timeout=0.2)
    assert calls == []
    assert summary.dead_lettered == {"poison": 1, **{reason: 1 for reason in variants}}
    dead = drain(binding, queue_name)
    assert kept(orjson.dumps(dead[0])) == poison and dead[0]["dead_letter"]["reason"] == "poison"
    assert dead[0]["dead_letter"]["original_queue"] == queue_name and dead[0]["dead_letter"]["attempts"] == 0
    assert [d["dead_letter"]["reason"] for d in dead[1:]] == list(variants)
    assert dead[1]["meta"]["schema_version"] == 2
    assert dead[1]["dead_letter"]["error"] == "the envelope failed validation: unsupported_schema_version"


def test_failures_are_retried_then_dead_lettered_as_failed(binding: Binding, queue_name: str) -> None:
    body = publish(binding, queue_name)[0]
    runs: list[int] = []

    def handler(env: dict) -> None:
        runs.append(env["attempts"])
        raise GatewayTimeout("Payment gateway timeout")

    summary = Consumer(binding, queue_name, {URN: handler}, max_attempts=3, backoff=NO_WAIT).run(reserve_timeout=0.5)
    assert runs == [0, 1, 2]
    assert summary.retried == 2 and summary.dead_lettered == {"failed": 1} and summary.handled == 0
    [dead] = drain(binding, queue_name)
    assert dead["dead_letter"] | {"failed_at": 0} == {
        "reason": "failed",
        "error": "Payment gateway timeout",
        "exception": "tests.bindings.test_consumer.GatewayTimeout",
        "failed_at": 0,
        "original_queue": queue_name,
        "attempts": 3,
        "lang": "python",
    }
    assert dead["meta"] == bq.decode(body)["meta"]


def test_a_flaky_handler_succeeds_on_retry(binding: Binding, queue_name: str) -> None:
    publish(binding, queue_name)
    runs: list[int] = []

    def handler(env: dict) -> None:
        runs.append(env["attempts"])
        if len(runs) == 1:
            raise ConnectionError("flaky")

    summary = Consumer(binding, queue_name, {URN: handler}, backoff=NO_WAIT).run(reserve_timeout=0.5)
    assert runs == [0, 1] and summary.handled == 1 and summary.retried == 1 and not summary.dead_lettered


@pytest.mark.parametrize("strategy", list(UnknownUrnStrategy))
def test_unknown_urn_strategies(binding: Binding, queue_name: str, strategy: UnknownUrnStrategy) -> None:
    publish(binding, queue_name, urn="urn:babel:nobody:handles")
    consumer = Consumer(binding, queue_name, {URN: print}, unknown_urn=strategy, max_attempts=2, backoff=NO_WAIT)
    summary = consumer.run(max_messages=2 if strategy is not UnknownUrnStrategy.RELEASE else 1, reserve_timeout=0.5)
    if strategy is UnknownUrnStrategy.DELETE:
        assert summary.deleted_unknown == 1
        assert binding.depth(queue_name) == 0 and binding.dead_letter_depth(queue_name) == 0
    elif strategy is UnknownUrnStrategy.RELEASE:
        assert summary.released_unknown == 1 and binding.dead_letter_depth(queue_name) == 0
        again = binding.reserve(queue_name, timeout=2)
        assert again is not None and again.attempts == 1
    else:
        [dead] = drain(binding, queue_name)
        assert dead["dead_letter"]["reason"] == "unknown_urn"
        assert dead["dead_letter"]["error"] == "no handler is mapped for urn:babel:nobody:handles"
        if strategy is UnknownUrnStrategy.FAIL:
            assert summary.retried == 1 and dead["dead_letter"]["exception"] == "LookupError"
        else:
            assert summary.retried == 0 and dead["dead_letter"]["exception"] is None


def test_idempotency_skips_redeliveries_of_handled_ids(binding: Binding, queue_name: str) -> None:
    from tests.bindings.test_seen_stores import store_or_refusal

    store = store_or_refusal(binding, f"consume-{uuid.uuid4().hex[:6]}")
    if store is None:  # that broker needs a SQL or Redis store; the refusal was checked
        return
    body = publish(binding, queue_name)[0]
    binding.publish(body, queue_name)  # the same message delivered twice (same meta.id)
    runs: list[str] = []
    summary = Consumer(binding, queue_name, {URN: lambda env: runs.append(env["meta"]["id"])}, idempotency=store).run(
        reserve_timeout=0.3
    )
    assert len(runs) == 1 and summary.handled == 1 and summary.skipped_duplicates == 1
    assert store.seen(bq.decode(body)["meta"]["id"]) and binding.depth(queue_name) == 0


def test_runs_are_bounded(binding: Binding, queue_name: str) -> None:
    publish(binding, queue_name, 5)
    assert Consumer(binding, queue_name, {URN: print}).run(max_messages=2).received == 2
    assert binding.depth(queue_name) == 3
    started = time.monotonic()
    summary = Consumer(binding, queue_name, {URN: print}).run(
        max_seconds=0.5, stop_when_empty=False, reserve_timeout=0.1
    )
    assert summary.received == 3 and 0.4 <= time.monotonic() - started < 5


def test_backoff_delays_the_retry(binding: Binding, queue_name: str) -> None:
    publish(binding, queue_name)

    def fail(_: dict) -> None:
        raise RuntimeError("later")

    summary = Consumer(binding, queue_name, {URN: fail}, backoff=Backoff("fixed", 1.0)).run(reserve_timeout=0.2)
    assert summary.retried == 1 and summary.received == 1  # the retry was not visible yet
    time.sleep(1.2)
    again = binding.reserve(queue_name, timeout=2)
    assert again is not None and again.attempts == 1
