"""The public BabelQueue conformance suite (``../shared/conformance``), every block that applies.

Broker blocks are run by the binding issues; the map at the bottom records who owns each block, and a
block that appears in a newer suite without an owner fails ``test_every_block_has_an_owner``.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.core.idempotency import Effect, IdempotencyGuard, InMemorySeenStore
from airflow_provider_babelqueue.core.payload_schema import payload_errors
from tests.conftest import compact, conformance_manifest, fixture_bytes, fixture_dict

MANIFEST = conformance_manifest()

# The reason our validator must give for each invalid case (the manifest states it only in prose).
EXPECTED_REASON = {
    "invalid-unknown-schema-version": bq.Reason.UNSUPPORTED_SCHEMA_VERSION,
    "invalid-missing-urn": bq.Reason.MISSING_URN,
}


@pytest.mark.parametrize("case", MANIFEST["cases"], ids=[c["name"] for c in MANIFEST["cases"]])
def test_case_verdict(case: dict[str, Any]) -> None:
    env = bq.decode(fixture_bytes(case["file"]))
    if not case["valid"]:
        assert case["name"] in EXPECTED_REASON, f"no expected reason recorded for new case {case['name']}"
        assert bq.check(env) == EXPECTED_REASON[case["name"]]
        assert not bq.accepts(env)
        return
    expect = case["expect"]
    assert bq.check(env) is None
    assert bq.urn_of(env) == expect["urn"]
    assert bq.data_of(env) == expect["data"]
    assert env["attempts"] == expect["attempts"]
    assert env["meta"]["lang"] == expect["lang"]
    assert env["meta"]["schema_version"] == expect["schema_version"]
    if "dead_letter" in expect:
        assert {k: env["dead_letter"][k] for k in expect["dead_letter"]} == expect["dead_letter"]
    else:
        assert "dead_letter" not in env


@pytest.mark.parametrize("case", MANIFEST["cases"], ids=[c["name"] for c in MANIFEST["cases"]])
def test_case_reencodes_to_the_compact_wire_bytes(case: dict[str, Any]) -> None:
    """Fixtures are stored pretty-printed in canonical order; on the wire they are the compact form."""
    raw = fixture_bytes(case["file"])
    assert bq.encode(bq.decode(raw)) == compact(fixture_dict(case["file"]))


def test_idempotency_dedup_key_is_meta_id() -> None:
    block = MANIFEST["idempotency"]["dedup_key"]
    assert block["key_field"] == "meta.id"
    env = fixture_dict(block["envelope_file"])
    assert bq.meta_id_of(env) == block["expected_key"]
    assert bq.meta_id_of(env) != env["trace_id"]


SEQUENCES = MANIFEST["idempotency"]["sequences"]["cases"]


@pytest.mark.parametrize("case", SEQUENCES, ids=[c["name"] for c in SEQUENCES])
def test_idempotency_sequence(case: dict[str, Any]) -> None:
    guard = IdempotencyGuard(InMemorySeenStore())
    invocations = 0

    for step, delivery in enumerate(case["deliveries"]):
        envelope = bq.make_envelope("urn:babel:orders:created", {"step": step})
        envelope["meta"]["id"] = delivery["meta_id"]
        if delivery.get("forget_before"):
            guard.forget(delivery["meta_id"])

        def handler(_: Any, outcome: str | None = delivery.get("outcome")) -> None:
            nonlocal invocations
            invocations += 1
            if outcome == "throw":
                raise RuntimeError("handler failed")

        if delivery.get("outcome") == "throw":
            with pytest.raises(RuntimeError):
                guard.process(envelope, handler)
            effect = Effect.RUN
        else:
            effect = guard.process(envelope, handler)
        assert effect == delivery["expect_effect"], f"delivery {step}"

    # The suite counts every handler invocation, throws included (see ARCHITECTURE.md §7).
    assert invocations == case["expected_effects"]


PAYLOAD_CASES = MANIFEST["payload_schema"]["cases"]


@pytest.mark.parametrize("case", PAYLOAD_CASES, ids=[c["name"] for c in PAYLOAD_CASES])
def test_payload_schema(case: dict[str, Any]) -> None:
    errors = payload_errors(case["data"], MANIFEST["payload_schema"]["schema"])
    assert (errors == []) is case["valid"], errors


# Who runs each manifest block. Broker blocks move from "pending" to a test module as bindings land.
BLOCK_OWNERS = {
    "schema_version": "metadata",
    "description": "metadata",
    "cases": "tests/test_conformance.py",
    "idempotency": "tests/test_conformance.py",
    "payload_schema": "tests/test_conformance.py",
    "redis": "tests/bindings/test_redis_binding.py (payload identity against the real server)",
    "rabbitmq": "tests/bindings/test_rabbitmq_binding.py (pure projection and a real published message)",
    "sqs": "tests/bindings/test_sqs_binding.py (pure functions, and the projection as received from moto's server)",
    "asb": "tests/bindings/test_asb_binding.py (pure projection and every reconciliation case, and the projection "
    "as a plain SDK receiver and the AMQP wire see it, through the Service Bus test double)",
    "pulsar": "tests/bindings/test_pulsar_binding.py (pure projection and reconciliation, and both as carried by the "
    "fake client, whose redeliveries come from negative acks)",
    "kafka": "not applicable: the product has no Kafka binding",
    "artemis": "not applicable: the product has no ActiveMQ Artemis binding",
}


def test_every_block_has_an_owner() -> None:
    unknown = sorted(set(MANIFEST) - set(BLOCK_OWNERS))
    assert not unknown, f"conformance blocks with no owner in this project: {unknown}"


def test_no_block_is_pending() -> None:
    """Every broker block is owned by a test module (or not applicable): none is left for later."""
    pending = {block: owner for block, owner in BLOCK_OWNERS.items() if owner.startswith("pending")}
    assert not pending, f"conformance blocks still pending: {pending}"
