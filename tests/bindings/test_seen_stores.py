"""Persistent seen-sets: the idempotency conformance sequences on every binding that holds one."""

from __future__ import annotations

import uuid

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding, NotSupportedError
from airflow_provider_babelqueue.core.idempotency import Effect, IdempotencyGuard
from tests.conftest import conformance_manifest

SEQUENCES = conformance_manifest()["idempotency"]["sequences"]["cases"]


# Brokers that cannot hold a seen-set: idempotency and replay ledgers use a SQL or Redis connection instead.
WITHOUT_STORE = {"rabbitmq", "sqs"}


def store_or_refusal(binding: Binding, name: str):  # type: ignore[no-untyped-def]
    """The binding's seen-set, or None after checking that a broker without one refuses clearly."""
    if binding.name in WITHOUT_STORE:
        with pytest.raises(NotSupportedError, match=r"use a babelqueue\+sql or babelqueue\+redis connection"):
            binding.seen_store(name)
        return None
    return binding.seen_store(name)


@pytest.mark.parametrize("case", SEQUENCES, ids=[c["name"] for c in SEQUENCES])
def test_conformance_sequences_on_a_persistent_store(binding: Binding, case: dict) -> None:
    store = store_or_refusal(binding, f"conf-{uuid.uuid4().hex[:8]}")
    if store is None:
        return
    guard = IdempotencyGuard(store)
    calls = 0
    for step, delivery in enumerate(case["deliveries"]):
        env = bq.make_envelope("urn:x", {"step": step})
        env["meta"]["id"] = delivery["meta_id"]
        if delivery.get("forget_before"):
            guard.forget(delivery["meta_id"])

        def handler(_: object, outcome: str | None = delivery.get("outcome")) -> None:
            nonlocal calls
            calls += 1
            if outcome == "throw":
                raise RuntimeError("boom")

        try:
            effect = guard.process(env, handler)
        except RuntimeError:
            effect = Effect.RUN
        assert effect == delivery["expect_effect"]
    assert calls == case["expected_effects"]


def test_stores_are_named_and_forget(make_binding) -> None:  # type: ignore[no-untyped-def]
    first = make_binding()
    name = f"ledger-{uuid.uuid4().hex[:8]}"
    store = store_or_refusal(first, name)
    if store is None:
        return
    store.remember("id-1")
    store.remember("id-1")
    assert store.seen("id-1") and not store.seen("id-2") and len(store) == 1
    assert not first.seen_store(f"{name}-other").seen("id-1")
    store.forget("id-1")
    assert not store.seen("id-1") and len(store) == 0
