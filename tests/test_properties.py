"""Property-based tests of the codec (hypothesis)."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.exceptions import EnvelopeDecodeError
from tests.strategies import JSON, envelopes

settings.register_profile("ci", max_examples=300, deadline=None)
settings.load_profile("ci")


@given(envelopes())
def test_decode_encode_round_trip(env: dict[str, Any]) -> None:
    decoded = bq.decode(bq.encode(env))
    assert decoded == env
    assert bq.check(decoded) is None


def interleave(keys: list[str], known: tuple[str, ...], rnd: random.Random) -> list[str]:
    """Known keys in random order, merged at random points with the unknown keys in their own order
    (unknown keys keep their relative order by design)."""
    shuffled = [k for k in keys if k in known]
    rnd.shuffle(shuffled)
    floor = 0
    for key in (k for k in keys if k not in known):
        floor = rnd.randint(floor, len(shuffled))
        shuffled.insert(floor, key)
        floor += 1
    return shuffled


@given(envelopes(), st.randoms(use_true_random=False))
def test_encode_is_canonical_whatever_the_key_order(env: dict[str, Any], rnd: random.Random) -> None:
    shuffled = {k: env[k] for k in interleave(list(env), bq.TOP_LEVEL_KEYS + ("dead_letter",), rnd)}
    shuffled["meta"] = {k: env["meta"][k] for k in interleave(list(env["meta"]), bq.META_KEYS, rnd)}
    assert bq.encode(shuffled) == bq.encode(env)


@given(envelopes())
def test_encode_matches_the_standard_library_writer(env: dict[str, Any]) -> None:
    """The reference form: compact, unescaped, Python float repr, canonical order."""
    assert bq.encode(env) == json.dumps(env, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


@given(st.binary(max_size=200))
def test_decode_of_arbitrary_bytes_is_a_dict_or_a_decode_error(body: bytes) -> None:
    try:
        value = bq.decode(body)
    except EnvelopeDecodeError:
        return
    assert isinstance(value, dict)
    assert bq.check(value) in (None, *bq.VALIDATION_REASONS)


@given(st.dictionaries(st.sampled_from(["job", "urn", "trace_id", "data", "meta", "attempts", "x"]), JSON))
def test_check_never_raises_on_decoded_objects(env: dict[str, Any]) -> None:
    reason = bq.check(env)
    assert reason is None or reason in bq.VALIDATION_REASONS
    assert bq.accepts(env) is (reason is None)
