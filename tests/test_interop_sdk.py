"""Interop with the official ``babelqueue`` Python SDK, used as an independent peer (test-only dependency)."""

from __future__ import annotations

from typing import Any

import pytest
from babelqueue import EnvelopeCodec
from babelqueue import dead_letter as sdk_dead_letter
from hypothesis import given

from airflow_provider_babelqueue import envelope as bq
from tests.conftest import conformance_manifest, fixture_bytes, fixture_dict
from tests.strategies import DATA, URN, envelopes

pytestmark = pytest.mark.interop

# The SDK refuses to *encode* the inbound-only ``urn`` alias, so that fixture is compared on decode only.
ENCODABLE = [c for c in conformance_manifest()["cases"] if "urn" not in fixture_dict(c["file"])]


@pytest.mark.parametrize("case", ENCODABLE, ids=[c["name"] for c in ENCODABLE])
def test_fixture_bytes_equal_the_sdk_encoder(case: dict[str, Any]) -> None:
    env = fixture_dict(case["file"])
    assert bq.encode(env) == EnvelopeCodec.encode(env).encode("utf-8")


@given(envelopes())
def test_generated_envelope_bytes_equal_the_sdk_encoder(env: dict[str, Any]) -> None:
    assert bq.encode(env) == EnvelopeCodec.encode(env).encode("utf-8")


@given(URN, DATA)
def test_sdk_made_envelopes_pass_our_check_and_encode_identically(urn: str, data: dict[str, Any]) -> None:
    env = EnvelopeCodec.make(urn, data, queue="orders")
    assert bq.check(env) is None
    sdk_bytes = EnvelopeCodec.encode(env).encode("utf-8")
    assert bq.encode(env) == sdk_bytes
    assert bq.decode(sdk_bytes) == env


@given(URN, DATA)
def test_our_envelopes_are_accepted_by_the_sdk(urn: str, data: dict[str, Any]) -> None:
    body = bq.encode(bq.make_envelope(urn, data, queue_name="orders"))
    decoded = EnvelopeCodec.decode(body.decode("utf-8"))
    assert EnvelopeCodec.accepts(decoded)
    assert EnvelopeCodec.urn(decoded) == urn.strip(" \t\n\v\f\r")
    assert decoded == bq.decode(body)


def test_urn_alias_fixture_reads_the_same_in_both() -> None:
    raw = fixture_bytes("fixtures/urn-alias.json").decode()
    ours = bq.decode(raw)
    theirs = EnvelopeCodec.decode(raw)
    assert bq.urn_of(ours) == EnvelopeCodec.urn(theirs) == "urn:babel:orders:created"
    assert bq.accepts(ours) and EnvelopeCodec.accepts(theirs)


def test_invalid_fixtures_are_rejected_by_both() -> None:
    raw = fixture_bytes("fixtures/invalid-unknown-schema-version.json").decode()
    assert not EnvelopeCodec.accepts(EnvelopeCodec.decode(raw))
    assert bq.check(bq.decode(raw)) == bq.Reason.UNSUPPORTED_SCHEMA_VERSION


def test_dead_letter_block_matches_the_sdk() -> None:
    env = fixture_dict("fixtures/order-created.json")
    theirs = sdk_dead_letter.annotate(env, "failed", "orders", 3, error="boom", exception="ValueError")
    ours = bq.annotate_dead_letter(
        env,
        bq.Reason.FAILED,
        original_queue="orders",
        attempts=3,
        error="boom",
        exception="ValueError",
        failed_at=theirs["dead_letter"]["failed_at"],
    )
    assert list(ours["dead_letter"]) == list(theirs["dead_letter"])
    assert ours == theirs
    assert bq.encode(ours) == EnvelopeCodec.encode(theirs).encode("utf-8")
