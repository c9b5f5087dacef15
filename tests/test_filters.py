"""``engine.filters``: which messages a filtered reader takes, decided on the decoded envelope alone (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_babelqueue.core import envelope as bq
from airflow_provider_babelqueue.engine.filters import MessageFilter, message_filter

CREATED = "urn:babel:orders:created"


def order(urn: str = CREATED, **data: Any) -> dict[str, Any]:
    return bq.make_envelope(urn, data, queue_name="orders")


def test_urn_patterns_are_shell_style_case_sensitive_and_any_of() -> None:
    orders = message_filter("urn:babel:orders:*")
    assert orders.matches(order()) and orders.matches(order("urn:babel:orders:refunded"))
    assert not orders.matches(order("urn:babel:invoices:created"))
    assert not orders.matches(order("URN:BABEL:ORDERS:CREATED"))
    exact = message_filter([CREATED, "urn:babel:invoices:?aid"])
    assert exact.urns == (CREATED, "urn:babel:invoices:?aid")
    assert [exact.matches(order(urn)) for urn in (CREATED, "urn:babel:invoices:paid", "urn:babel:orders:created2",
                                                  "urn:babel:invoices:unpaid")] == [True, True, False, False]


def test_the_urn_alias_is_matched_like_job() -> None:
    env = order()
    aliased = {("urn" if key == "job" else key): value for key, value in env.items()}
    assert message_filter(CREATED).matches(aliased)
    assert not message_filter("urn:babel:other").matches(aliased)


def test_jsonpath_presence_of_a_field() -> None:
    coupon = message_filter(jsonpath="$.coupon")
    assert coupon.matches(order(coupon="SPRING"))
    assert coupon.matches(order(coupon=None))  # present, even when null
    assert not coupon.matches(order(total=3))
    assert message_filter(jsonpath="$.customer.vip").matches(order(customer={"vip": False}))
    assert not message_filter(jsonpath="$.customer.vip").matches(order(customer={"name": "Zoë"}))


def test_jsonpath_condition_inside_a_list() -> None:
    bulk = message_filter(jsonpath="$.items[?@.qty > 2]")
    assert bulk.matches(order(items=[{"qty": 1}, {"qty": 3}]))
    assert not bulk.matches(order(items=[{"qty": 1}, {"qty": 2}]))
    assert not bulk.matches(order(items=[]))
    assert not bulk.matches(order())


def test_jsonpath_condition_on_a_top_level_field() -> None:
    big = message_filter(jsonpath="$[?$.amount > 100]")
    assert [big.matches(order(amount=amount)) for amount in (101, 100.5, 100, 7)] == [True, True, False, False]
    assert not big.matches(order(amount="150"))  # a string is not compared with a number
    assert not big.matches(order())
    eur = message_filter(jsonpath="$[?$.amount > 100 && $.currency == 'EUR']")
    assert eur.matches(order(amount=150, currency="EUR"))
    assert not eur.matches(order(amount=150, currency="USD"))
    assert not eur.matches(order(amount=50, currency="EUR"))


def test_php_empty_data_list_is_an_empty_payload() -> None:
    env = order()
    env["data"] = []  # PHP's json_encode of an empty array
    assert not message_filter(jsonpath="$.coupon").matches(env)
    assert message_filter(CREATED).matches(env)


def test_both_set_both_must_match() -> None:
    both = message_filter("urn:babel:orders:*", "$[?$.amount > 100]")
    assert both.matches(order(amount=150))
    assert not both.matches(order(amount=50))
    assert not both.matches(order("urn:babel:invoices:created", amount=150))


def test_poison_and_invalid_envelopes_never_match_an_active_filter() -> None:
    unsupported = order(amount=150)
    unsupported["meta"]["schema_version"] = 2
    no_trace = order(amount=150)
    del no_trace["trace_id"]
    for active in (message_filter(CREATED), message_filter(jsonpath="$.amount"), message_filter("*", "$")):
        assert active.active
        assert not active.matches(None)  # undecodable
        assert not active.matches(unsupported)
        assert not active.matches(no_trace)
        assert active.matches(order(amount=150))


def test_an_empty_filter_takes_everything_poison_included() -> None:
    for empty in (MessageFilter(), message_filter(), message_filter(None, None), message_filter([], "")):
        assert not empty.active
        assert empty.describe() == "every message"
        assert empty.matches(None) and empty.matches(order()) and empty.matches({"not": "an envelope"})


def test_an_invalid_jsonpath_is_a_value_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"The JSONPath filter '\$\.items\[\?@\.qty >' is not valid RFC 9535"):
        message_filter(jsonpath="$.items[?@.qty >")
    with pytest.raises(ValueError, match=r"'amount > 100' is not valid RFC 9535"):
        message_filter(jsonpath="amount > 100")
    with pytest.raises(ValueError, match="JSONPath filter must be a non-empty string"):
        MessageFilter(jsonpath="  ")
    with pytest.raises(ValueError, match="URN filter must be a non-empty string pattern"):
        message_filter(["urn:a", " "])


def test_describe_and_as_kwargs_round_trip() -> None:
    both = message_filter(["urn:babel:orders:*", CREATED], "$[?$.amount > 100]")
    assert both.describe() == "urn in urn:babel:orders:*, urn:babel:orders:created and data matches $[?$.amount > 100]"
    assert both.as_kwargs() == {"urns": ["urn:babel:orders:*", CREATED], "jsonpath": "$[?$.amount > 100]"}
    for original in (both, message_filter(CREATED), message_filter(jsonpath="$.coupon"), message_filter()):
        again = message_filter(**original.as_kwargs())
        assert again == original and again.active == original.active
        assert [again.matches(e) for e in (order(amount=150), order(coupon=1), None)] == \
            [original.matches(e) for e in (order(amount=150), order(coupon=1), None)]
    assert message_filter().as_kwargs() == {"urns": None, "jsonpath": None}
    assert message_filter("urn:one").urns == ("urn:one",) and MessageFilter(urns="urn:one").urns == (  # type: ignore[arg-type]
        "urn:one",)
