"""Hypothesis strategies for envelopes: unicode text, nested data, big ints, floats of every magnitude."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from airflow_provider_babelqueue import envelope as bq

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# Everything but lone surrogates, which are not text and cannot be written as UTF-8.
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=24)
FLOATS = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1e-7, 2e-5, 1e16, 1e22, -0.0, 5e-324])
SCALARS = st.none() | st.booleans() | INT64 | FLOATS | TEXT
JSON = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(TEXT, children, max_size=5),
    max_leaves=25,
)
DATA = st.dictionaries(TEXT, JSON, max_size=6)
URN = TEXT.filter(lambda u: u.strip(" \t\n\v\f\r") != "")


@st.composite
def envelopes(draw: st.DrawFn) -> dict[str, Any]:
    """Envelopes as our producer makes them, sometimes with unknown keys and a dead_letter block."""
    env = bq.make_envelope(
        draw(URN),
        draw(DATA),
        queue_name=draw(URN),
        trace_id=draw(st.none() | st.uuids().map(str)),
    )
    env["attempts"] = draw(st.integers(min_value=0, max_value=50))
    extra = draw(
        st.dictionaries(TEXT.filter(lambda k: k not in bq.TOP_LEVEL_KEYS + ("dead_letter",)), JSON, max_size=2)
    )
    env.update(extra)
    if draw(st.booleans()):
        env = bq.annotate_dead_letter(
            env,
            draw(st.sampled_from(list(bq.Reason))),
            original_queue=draw(TEXT),
            attempts=env["attempts"],
            error=draw(st.none() | TEXT),
            exception=draw(st.none() | TEXT),
        )
    return env
