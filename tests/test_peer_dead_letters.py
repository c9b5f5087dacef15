"""What peer SDKs leave on their dead-letter queues, read by the core, the replayer and the sensors' samples.

* The Python SDK's poison wrapper (``{"raw": …, "raw_encoding"?: "base64", "dead_letter": {"reason": "poison"}}``)
  is recognised by ``core.peer.poison_wrapper``, which gives the original bytes back; it is never replayed.
* Dead letters' ``attempts``: Node and PHP write 2 and 2 after three failed runs, the Python SDK (and the spec's
  example) 3 and 3; readers accept both, and this provider writes 3 and 3.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import orjson
import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.bodies import dead_letter_body
from airflow_provider_babelqueue.bindings.memory import MemoryBinding
from airflow_provider_babelqueue.bindings.message import ReceivedMessage, parse_body
from airflow_provider_babelqueue.core.peer import PoisonWrapper, poison_wrapper
from airflow_provider_babelqueue.engine.checks import dead_letter_status
from airflow_provider_babelqueue.engine.consume import Backoff, Consumer
from airflow_provider_babelqueue.engine.replay import Item, Replayer, feed_from_dead_letters
from tests.conftest import ROOT

CAPTURES = ROOT.parent / "shared" / "interop" / "peer-captures"
QUIET = logging.getLogger("tests.peer_dead_letters")
NO_WAIT = Backoff("fixed", 0.0)


def capture(name: str) -> bytes:
    return base64.b64decode(json.loads((CAPTURES / f"{name}.json").read_text())["body_b64"])


# ------------------------------------------------------------------------------------ poison wrappers


@pytest.mark.parametrize(("name", "raw", "encoding", "error"), [
    ("python-redis-poison", b"not json", "utf-8", "Undecodable BabelQueue body"),
    ("python-redis-poison-binary", bytes.fromhex("fffe206e6f74207574662d3820c328"), "base64",
     "Undecodable BabelQueue body"),
    ("python-rabbitmq-poison", b"not json", "utf-8",
     "Undecodable BabelQueue body: invalid JSON: Expecting value: line 1 column 1 (char 0)"),
])
def test_the_python_poison_wrapper_gives_back_the_original_bytes(name: str, raw: bytes, encoding: str,
                                                                 error: str) -> None:
    stored = capture(name)
    wrapper = poison_wrapper(stored)
    assert isinstance(wrapper, PoisonWrapper)
    assert (wrapper.raw, wrapper.raw_encoding, wrapper.reason) == (raw, encoding, "poison")
    assert wrapper.dead_letter == orjson.loads(stored)["dead_letter"]
    assert list(wrapper.dead_letter) == list(bq.DEAD_LETTER_KEYS)
    assert wrapper.dead_letter["error"] == error and wrapper.dead_letter["attempts"] == 0
    assert poison_wrapper(orjson.loads(stored)) == wrapper  # the decoded object reads the same


@pytest.mark.parametrize("name", [
    "python-redis-plain", "python-redis-dead-letter", "python-redis-headers", "python-redis-dead-letter-headers",
    "node-redis-poison", "node-redis-poison-binary", "node-redis-dead-letter", "php-redis-dead-letter",
])
def test_envelopes_frames_and_raw_poison_are_not_wrappers(name: str) -> None:
    stored = capture(name)
    assert poison_wrapper(stored) is None
    envelope = parse_body(stored)[0]
    assert envelope is None or poison_wrapper(envelope) is None


@pytest.mark.parametrize("stored", [
    b'{"raw":"x","raw_encoding":"base64","dead_letter":{"reason":"poison"}}',  # not base64
    b'{"raw":"eA==","raw_encoding":"hex","dead_letter":{"reason":"poison"}}',  # unknown encoding
    b'{"raw":1,"dead_letter":{"reason":"poison"}}',
    b'{"raw":"x","dead_letter":"poison"}',
    b'{"raw":"x"}',
    b'{"raw":"x","dead_letter":{},"job":"urn:babel:orders:created"}',  # an envelope with a stray key
    b'{"raw":"x","dead_letter":{},"meta":{}}',
    b'["raw","dead_letter"]',
    b'{"raw":',
])
def test_what_is_not_a_well_formed_wrapper_is_not_one(stored: bytes) -> None:
    assert poison_wrapper(stored) is None


def test_a_wrapper_without_a_reason_still_reads_as_poison() -> None:
    wrapper = poison_wrapper(b'{"raw":"eA==","raw_encoding":"base64","dead_letter":{}}')
    assert wrapper == PoisonWrapper(b"x", {}, "base64") and wrapper.reason == "poison"


def test_poison_wrappers_are_never_replayed() -> None:
    binding = MemoryBinding()
    dlq = binding.dead_letter_name("orders")
    for name in ("python-redis-poison", "python-redis-poison-binary", "python-rabbitmq-poison"):
        binding.put_dead_letter(capture(name), dlq)
    binding.put_dead_letter(capture("python-redis-dead-letter"), dlq)
    replayer = Replayer(target=binding, ledger_binding=binding, target_queue_name="orders", source=binding)
    feed_from_dead_letters(replayer, binding, "orders", 0)
    replayer.finish()
    assert replayer.result.as_dict()["skipped"] == {"poison": 3} and replayer.result.replayed == 1
    assert binding.depth("orders") == 1
    # the wrappers stay in the DLQ, byte for byte, for triage
    assert sorted(m.body for m in binding.browse_dead_letters("orders")) == sorted(
        capture(name) for name in ("python-redis-poison", "python-redis-poison-binary", "python-rabbitmq-poison"))


def test_sensor_samples_report_poison_wrappers_as_poison() -> None:
    binding = MemoryBinding()
    binding.put_dead_letter(capture("python-redis-poison-binary"), binding.dead_letter_name("orders"))
    binding.put_dead_letter(capture("node-redis-poison"), binding.dead_letter_name("orders"))
    status = dead_letter_status(binding, "orders", reasons=["poison"])
    assert status.matching == 2 and status.matched
    assert status.sample == [{"meta_id": "", "urn": "", "reason": "poison"}] * 2
    assert dead_letter_status(binding, "orders", reasons=["missing_urn"]).matching == 0


# -------------------------------------------------------------------------------- dead letters' attempts


@pytest.mark.parametrize(("name", "attempts"), [
    ("node-redis-dead-letter", 2), ("php-redis-dead-letter", 2), ("python-redis-dead-letter", 3),
])
def test_peer_dead_letters_are_read_and_replayed_whatever_attempts_they_wrote(name: str, attempts: int) -> None:
    stored = capture(name)
    envelope, error, body_attempts = parse_body(stored)
    assert error is None and envelope is not None and bq.check(envelope) is None
    assert body_attempts == envelope["dead_letter"]["attempts"] == attempts
    binding = MemoryBinding()
    replayer = Replayer(target=binding, ledger_binding=binding, target_queue_name="orders")
    replayer.feed(Item(stored, "orders"))
    replayer.finish()
    assert replayer.result.replayed == 1
    published = binding.reserve("orders")
    assert published is not None and published.attempts == 0 and "dead_letter" not in (published.envelope or {})


def test_our_dead_letter_after_three_failed_runs_says_3_and_3_as_the_python_sdk() -> None:
    peer = orjson.loads(capture("python-redis-dead-letter"))
    binding = MemoryBinding()
    binding.publish(bq.encode(bq.make_envelope(peer["job"], peer["data"], queue_name="orders")), "orders")
    runs: list[int] = []

    def handler(envelope: dict[str, Any]) -> None:
        runs.append(envelope["attempts"])
        raise RuntimeError("card declined by issuer")

    Consumer(binding, "orders", {peer["job"]: handler}, max_attempts=3, backoff=NO_WAIT, log=QUIET).run(
        reserve_timeout=0)
    [dead] = binding.browse_dead_letters("orders")
    ours = orjson.loads(dead.body)
    assert runs == [0, 1, 2]
    assert (ours["attempts"], ours["dead_letter"]["attempts"]) == (peer["attempts"], peer["dead_letter"]["attempts"])
    assert (ours["attempts"], ours["dead_letter"]["attempts"]) == (3, 3)
    assert list(ours) == list(peer) and list(ours["dead_letter"]) == list(peer["dead_letter"])


@pytest.mark.parametrize(("body_attempts", "top"), [(2, 3), (0, 3), ("2", "2"), (-1, -1), (None, None)])
def test_dead_letter_body_writes_the_attempts_used_up_at_the_top_level_too(body_attempts: object,
                                                                          top: object) -> None:
    """``message.attempts`` (3: the consumer's count of runs) goes into the block and the top level; a top-level
    value that is not a non-negative integer stays, as the evidence of an ``invalid_attempts`` quarantine."""
    env = bq.make_envelope("urn:babel:orders:charge-card", {"order_id": 1042}, queue_name="orders")
    env["attempts"] = body_attempts
    body = bq.encode(env)
    message = ReceivedMessage(body, "orders", parse_body(body)[0], None, 3)
    stored = orjson.loads(dead_letter_body(message, "failed", error="card declined by issuer"))
    assert stored["attempts"] == top and stored["dead_letter"]["attempts"] == 3
    assert list(stored) == ["job", "trace_id", "data", "meta", "attempts", "dead_letter"]
