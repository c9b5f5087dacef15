"""The pure checks behind sensors and triggers, on every binding."""

from __future__ import annotations

import json

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding, NotSupportedError
from airflow_provider_babelqueue.engine.checks import compare, dead_letter_status, depth_status


def publish(binding: Binding, queue_name: str, urn: str = "urn:babel:orders:created", n: int = 1) -> None:
    for i in range(n):
        binding.publish(bq.encode(bq.make_envelope(urn, {"n": i}, queue_name=queue_name)), queue_name)


def dead_letter(binding: Binding, queue_name: str, reason: str, urn: str = "urn:babel:orders:created") -> str:
    publish(binding, queue_name, urn)
    # reserve returns as soon as the message arrives; 5 s leaves room for the Service Bus double under load
    message = binding.reserve(queue_name, timeout=5)
    assert message is not None, f"the message published to {queue_name} was not delivered within 5 s"
    binding.dead_letter(message, reason)
    return message.meta_id


@pytest.mark.parametrize(
    ("observed", "comparison", "threshold", "expected"),
    [(3, ">=", 3, True), (3, ">", 3, False), (0, "<=", 0, True), (1, "<", 1, False), (2, "==", 2, True)],
)
def test_compare(observed: int, comparison: str, threshold: int, expected: bool) -> None:
    assert compare(observed, comparison, threshold) is expected


def test_compare_rejects_unknown_operators() -> None:
    with pytest.raises(ValueError, match="comparison must be one of >=, >, <=, <, =="):
        compare(1, "=>", 1)


def test_depth_status_on_ready_and_dead_letter_queues(binding: Binding, queue_name: str) -> None:
    assert depth_status(binding, queue_name).matched is False
    publish(binding, queue_name, n=3)
    status = depth_status(binding, queue_name, comparison=">=", threshold=3)
    assert (status.matched, status.depth) == (True, 3)
    assert depth_status(binding, queue_name, which="dead_letter", comparison="==", threshold=0).matched
    assert depth_status(binding, queue_name, comparison="<=", threshold=0).matched is False


def test_consecutive_observations_all_have_to_match(binding: Binding, queue_name: str) -> None:
    publish(binding, queue_name, n=2)
    sleeps: list[float] = []

    def drain_one_between_observations(seconds: float) -> None:
        sleeps.append(seconds)
        binding.ack(binding.reserve(queue_name, timeout=1))

    status = depth_status(
        binding, queue_name, threshold=2, consecutive=3, interval=0.25, sleep=drain_one_between_observations
    )
    assert status.matched is False and status.observations == (2, 1) and sleeps == [0.25]
    steady = depth_status(binding, queue_name, threshold=1, consecutive=3, interval=0.0, sleep=lambda s: None)
    assert steady.matched and steady.observations == (1, 1, 1)


def test_dead_letter_status_counts_and_growth(binding: Binding, queue_name: str) -> None:
    assert dead_letter_status(binding, queue_name).matched is False
    first = dead_letter(binding, queue_name, "failed")
    status = dead_letter_status(binding, queue_name)
    assert (status.matched, status.depth, status.matching) == (True, 1, 1)
    if binding.can_browse:
        assert status.sample == [{"meta_id": first, "urn": "urn:babel:orders:created", "reason": "failed"}]
    assert dead_letter_status(binding, queue_name, baseline=1).matched is False
    dead_letter(binding, queue_name, "unknown_urn")
    assert dead_letter_status(binding, queue_name, baseline=1).matched is True
    assert dead_letter_status(binding, queue_name, baseline=1, min_count=2).matched is False


def test_dead_letter_filters_by_reason_and_urn(binding: Binding, queue_name: str) -> None:
    dead_letter(binding, queue_name, "failed", urn="urn:babel:orders:created")
    dead_letter(binding, queue_name, "unknown_urn", urn="urn:babel:billing:charged")
    binding.publish(b"\xff poison", queue_name)
    binding.dead_letter(binding.reserve(queue_name, timeout=1), "poison")
    if not binding.can_browse:
        with pytest.raises(NotSupportedError, match="needs a broker that can browse"):
            dead_letter_status(binding, queue_name, reasons=["failed"])
        return
    by_reason = dead_letter_status(binding, queue_name, reasons=["unknown_urn", "poison"])
    assert (by_reason.matched, by_reason.depth, by_reason.matching) == (True, 3, 2)
    assert [e["reason"] for e in by_reason.sample] == ["unknown_urn", "poison"]
    by_urn = dead_letter_status(binding, queue_name, urns=["urn:babel:billing:charged"], min_count=2)
    assert (by_urn.matched, by_urn.matching) == (False, 1)


def test_a_poison_wrapper_is_sampled_with_the_reason_its_consumer_gave() -> None:
    """A body that could not be annotated keeps the consumer's reason beside its bytes; sensors match on it."""
    from airflow_provider_babelqueue.bindings.memory import MemoryBinding

    binding = MemoryBinding()
    for body, reason in ((b"\xff not json", "failed"), (b"also not json", "poison")):
        binding.publish(body, "orders")
        message = binding.reserve("orders")
        assert message is not None and message.envelope is None
        binding.dead_letter(message, reason, error="boom")
    status = dead_letter_status(binding, "orders", reasons=["failed"])
    assert status.matching == 1 and [entry["reason"] for entry in status.sample] == ["failed"]
    assert dead_letter_status(binding, "orders", reasons=["poison"]).matching == 1


def seed_orders_and_others(binding: Binding, queue_name: str) -> dict[str, str]:
    """Six dead letters of different URNs and data, named by what they are; the values are their ``meta.id``."""
    ids: dict[str, str] = {}
    for name, urn, data, reason in (
        ("big_order", "urn:babel:orders:created", {"amount": 150}, "failed"),
        ("small_order", "urn:babel:orders:created", {"amount": 50}, "failed"),
        ("big_refund", "urn:babel:orders:refunded", {"amount": 500}, "unknown_urn"),
        ("big_charge", "urn:babel:billing:charged", {"amount": 900}, "failed"),
    ):
        binding.publish(bq.encode(bq.make_envelope(urn, data, queue_name=queue_name)), queue_name)
        message = binding.reserve(queue_name, timeout=5)
        assert message is not None
        binding.dead_letter(message, reason)
        ids[name] = message.meta_id
    # an order quarantined because its data is a list: it breaks a contract rule, yet it is an order by its URN
    broken = bq.make_envelope("urn:babel:orders:created", {"amount": 999}, queue_name=queue_name) | {"data": [999]}
    binding.publish(json.dumps(broken).encode(), queue_name)
    message = binding.reserve(queue_name, timeout=5)
    assert message is not None
    binding.dead_letter(message, "invalid_data")
    ids["invalid_order"] = message.meta_id
    binding.publish(b"\xff poison", queue_name)  # no URN, no data: never matches a URN or JSONPath filter
    message = binding.reserve(queue_name, timeout=5)
    assert message is not None
    binding.dead_letter(message, "poison")
    return ids


def test_dead_letter_filters_by_urn_pattern_and_jsonpath(binding: Binding, queue_name: str) -> None:
    ids = seed_orders_and_others(binding, queue_name)
    if not binding.can_browse:
        with pytest.raises(NotSupportedError, match="reason, URN or JSONPath needs a broker that can browse"):
            dead_letter_status(binding, queue_name, jsonpath="$[?$.amount > 100]")
        with pytest.raises(NotSupportedError, match="needs a broker that can browse"):
            dead_letter_status(binding, queue_name, urns=["urn:babel:orders:*"])
        assert dead_letter_status(binding, queue_name).matching == 6  # unfiltered: the depth
        return

    def matching(**filters: object) -> tuple[int, int, list[str]]:
        status = dead_letter_status(binding, queue_name, sample_size=10, **filters)  # type: ignore[arg-type]
        names = {meta_id: name for name, meta_id in ids.items()}
        return status.depth, status.matching, [names.get(e["meta_id"], e["reason"]) for e in status.sample]

    both = matching(urns=["urn:babel:orders:*"], jsonpath="$[?$.amount > 100]")
    assert both == (6, 2, ["big_order", "big_refund"])
    assert matching(urns=["urn:babel:orders:*"]) == (6, 4, ["big_order", "small_order", "big_refund", "invalid_order"])
    assert matching(jsonpath="$[?$.amount > 100]") == (6, 3, ["big_order", "big_refund", "big_charge"])
    # an exact URN is a pattern that matches only itself; the invalid envelope still counts by its URN
    assert matching(urns=["urn:babel:orders:created"]) == (6, 3, ["big_order", "small_order", "invalid_order"])
    assert matching(urns="urn:babel:billing:charged")[1:] == (1, ["big_charge"])
    assert matching(urns=["URN:BABEL:ORDERS:*"])[1] == 0  # case-sensitive
    assert matching(jsonpath="$.coupon")[1] == 0  # a field no dead letter has
    assert matching(reasons=["failed"], urns=["urn:babel:orders:*"], jsonpath="$[?$.amount > 100]")[1:] == (
        1, ["big_order"])
    assert matching(reasons=["poison"])[1:] == (1, ["poison"])
    assert matching(reasons=["poison"], jsonpath="$")[1] == 0  # a poison body has no data for any JSONPath
    status = dead_letter_status(binding, queue_name, urns=["urn:babel:orders:*"], jsonpath="$[?$.amount > 100]",
                                min_count=3)
    assert (status.matched, status.depth, status.matching) == (False, 6, 2)
    grown = dead_letter_status(binding, queue_name, baseline=5, jsonpath="$[?$.amount > 100]")
    assert (grown.matched, grown.matching) == (True, 3)


def test_an_invalid_jsonpath_is_refused_before_the_broker_is_asked() -> None:
    from airflow_provider_babelqueue.bindings.memory import MemoryBinding

    with pytest.raises(ValueError, match=r"The JSONPath filter '\$\[\?amount' is not valid RFC 9535"):
        dead_letter_status(MemoryBinding(), "orders", jsonpath="$[?amount")
    with pytest.raises(ValueError, match="non-empty string pattern"):
        dead_letter_status(MemoryBinding(), "orders", urns=[""])
