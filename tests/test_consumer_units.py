"""Pure parts of the consumer: backoff arithmetic, exception names, argument checks."""

from __future__ import annotations

import random

import pytest

from airflow_provider_babelqueue.bindings.memory import MemoryBinding
from airflow_provider_babelqueue.engine.consume import Backoff, Consumer, exception_name


def test_fixed_backoff() -> None:
    assert [Backoff("fixed", 2.5).delay(n) for n in (0, 1, 10)] == [2.5, 2.5, 2.5]


def test_exponential_backoff_doubles_up_to_the_cap() -> None:
    plain = Backoff("exponential", 1.0, cap=10.0, jitter=False)
    assert [plain.delay(n) for n in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert plain.delay(10_000) == 10.0


def test_jitter_stays_between_half_and_full_delay() -> None:
    jittered = Backoff("exponential", 1.0, cap=100.0)
    rng = random.Random(3)
    delays = [jittered.delay(3, rng) for _ in range(500)]
    assert min(delays) >= 4.0 and max(delays) <= 8.0 and len(set(delays)) > 400


def test_backoff_and_consumer_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="'fixed' or 'exponential'"):
        Backoff("linear")
    with pytest.raises(ValueError, match="must not be negative"):
        Backoff("fixed", -1)
    with pytest.raises(ValueError, match="max_attempts must be at least 1"):
        Consumer(MemoryBinding(), "q", {}, max_attempts=0)
    with pytest.raises(ValueError, match="'sometimes' is not a valid UnknownUrnStrategy"):
        Consumer(MemoryBinding(), "q", {}, unknown_urn="sometimes")


def test_exception_names() -> None:
    class Local(Exception):
        pass

    assert exception_name(ValueError("x")) == "ValueError"
    assert exception_name(Local()) == f"{__name__}.test_exception_names.<locals>.Local"
