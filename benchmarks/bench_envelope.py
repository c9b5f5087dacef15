"""Envelope codec throughput: ours against the official babelqueue SDK, same run, same inputs.

Two workloads over the same N payloads (default 100k):
  * make+encode: build a new envelope and serialise it to wire bytes;
  * decode+check: parse wire bytes and run consumer validation.

Each side runs ``--rounds`` times; the best round counts (least disturbed by the machine).

In the same run, per profile, each workload is also set against its floor, the least any codec must do:
  * decode+check floor: bare ``orjson.loads`` of the very same encoded bodies, nothing else;
  * make+encode floor: a dict of our envelope's shape (``job, trace_id, data, meta{id, queue, lang,
    schema_version, created_at}, attempts``) built with two ``str(uuid.uuid4())`` and an integer ms timestamp
    around the same payload, then ``orjson.dumps``.
Goal: ours ≤ 1.5× the floor's time (ours ÷ floor); the SDK's ratio is reported beside it as a speed ratio
(SDK time ÷ ours, >1 when ours is faster), as in the first table. A summary table of those rows ends the output.

Then the cost of the integer-range check (every integer within signed 64-bit) inside ``decode``, per profile,
on its two paths: decode+check as shipped (the typed reader of ``core.typed_read``, the check inside msgspec's
parse) and decode+check on the orjson path (``core.integers``' byte pre-check after ``orjson.loads``, what
``decode`` does where msgspec is missing), each against the same decode+check without any range check
(``orjson.loads`` and the object test), in the same run, as ratios of their times. A third profile,
``digits``, has a 20-digit id *string* in every body: on the orjson path the pre-check fires on every body and
the exact step (digits outside strings) runs each time: that path's worst case for a body that passes.
Run: ``make bench`` or ``.venv/bin/python benchmarks/bench_envelope.py [--n 100000]``.
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import time
import uuid
from collections.abc import Callable

import orjson
from babelqueue import EnvelopeCodec

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.core.envelope import _read_orjson as read_on_orjson
from airflow_provider_babelqueue.core.errors import EnvelopeDecodeError

#: The issue's goal for both workloads: ours at most this many times the floor's time.
FLOOR_GOAL = 1.5


def small_payloads(n: int, seed: int = 7) -> list[dict]:
    """The contract's canonical example shape: an order id and an amount."""
    rng = random.Random(seed)
    return [{"order_id": 100000 + i, "amount": round(rng.uniform(1, 500), 2)} for i in range(n)]


def rich_payloads(n: int, seed: int = 7) -> list[dict]:
    """Realistic order payloads: ints, floats, unicode, a nested list of line items, null and bool."""
    rng = random.Random(seed)
    cities = ["İstanbul", "München", "São Paulo", "Kraków", "Zürich", "東京", "Paris"]
    out = []
    for i in range(n):
        out.append(
            {
                "order_id": 100000 + i,
                "customer": {
                    "id": rng.randrange(10**9),
                    "city": rng.choice(cities),
                    "vip": rng.random() < 0.1,
                },
                "items": [
                    {
                        "sku": f"SKU-{rng.randrange(10**6):06d}",
                        "qty": rng.randrange(1, 5),
                        "price": round(rng.uniform(1, 500), 2),
                    }
                    for _ in range(rng.randrange(1, 4))
                ],
                "currency": "EUR",
                "coupon": None,
                "note": "livraison 48h / côté cour",
            }
        )
    return out


def digits_payloads(n: int, seed: int = 7) -> list[dict]:
    """Small payloads plus a 20-digit id carried as a string (as the contract asks for such ids)."""
    rng = random.Random(seed)
    return [{"order_id": 100000 + i, "amount": round(rng.uniform(1, 500), 2),
             "ledger_id": str(10**19 + rng.randrange(10**19))} for i in range(n)]


def decode_without_range_check(body: bytes) -> dict:
    """``envelope.decode`` without the integer-range check: the decode+check baseline of the check's cost."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise EnvelopeDecodeError(f"The body is not valid JSON: {exc}.") from exc
    if value.__class__ is not dict:
        raise EnvelopeDecodeError("The body is JSON but not an object.")
    return value


def best_interleaved(rounds: int, sides: tuple[Callable[[], object], ...]) -> list[float]:
    """Each side's best wall time over ``rounds`` rounds that run every side in turn: the sides sample the same
    seconds of a machine whose speed drifts, so their ratio does not depend on which one ran in a slow spell."""
    best = [float("inf")] * len(sides)
    for _ in range(rounds):
        for index, side in enumerate(sides):
            best[index] = min(best[index], best_of(1, side))
    return best


def best_of(rounds: int, fn: Callable[[], object]) -> float:
    """Best wall time of ``rounds`` runs, with the cyclic GC paused while timing (as timeit does), so
    collections triggered by the other side's garbage do not land in this side's time."""
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
        finally:
            gc.enable()
    return best


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", choices=["small", "rich", "both"], default="both")
    args = parser.parse_args(argv)
    print(
        f"envelope codec, {args.n:,} envelopes per profile, best of {args.rounds}; python {platform.python_version()}"
    )
    print(f"{'profile':<8} {'workload':<14} {'ours msg/s':>14} {'sdk msg/s':>14} {'ratio':>8}")
    results = {}
    floors: list[tuple[str, str, float, float, float]] = []
    profiles = ("small", "rich") if args.profile == "both" else (args.profile,)
    for profile in profiles:
        data = (small_payloads if profile == "small" else rich_payloads)(args.n)
        for name, ratio in run_profile(data, args.rounds, floors).items():
            results[f"{profile}/{name}"] = ratio
    print()
    print(
        f"against the floor (same run, best of {args.rounds}): goal ours/floor <= {FLOOR_GOAL}; "
        "sdk/ours = SDK time / ours (>1: ours faster)"
    )
    for profile, name, us_ours, us_floor, us_sdk in floors:
        ratio = us_ours / us_floor
        results[f"{profile}/{name}/floor"] = ratio
        print(
            f"{profile:<8} {name:<14} ours {us_ours:7.3f} us/msg  floor {us_floor:7.3f} us/msg  "
            f"ours/floor {ratio:5.2f}x ({_met(ratio)})  sdk {us_sdk:7.3f} us/msg  sdk/ours {us_sdk / us_ours:5.2f}x"
        )
    print()
    print("integer-range check inside decode: decode+check with the check vs without it (same run);")
    print("shipped = the typed reader (check inside the parse), orjson path = orjson.loads + byte pre-check")
    print(f"{'profile':<8} {'without msg/s':>14} {'shipped msg/s':>14} {'time ratio':>11} "
          f"{'orjson path msg/s':>18} {'time ratio':>11}")
    for profile in (*profiles, "digits"):
        maker = {"small": small_payloads, "rich": rich_payloads, "digits": digits_payloads}[profile]
        results[f"{profile}/range-check"] = run_range_check(profile, maker(args.n), args.rounds)
    print()
    print("summary: ours vs floor (goal) and vs the SDK (speed ratio, >1: ours faster)")
    print(
        f"{'measurement':<14} {'profile':<8} {'ours us':>8} {'floor us':>9} {'ratio':>7} {'goal':>6} "
        f"{'met':<8} {'SDK ratio':>9}"
    )
    for profile, name, us_ours, us_floor, us_sdk in floors:
        ratio = us_ours / us_floor
        print(
            f"{name:<14} {profile:<8} {us_ours:>8.3f} {us_floor:>9.3f} {ratio:>6.2f}x {'<=' + str(FLOOR_GOAL):>6} "
            f"{_met(ratio):<8} {us_sdk / us_ours:>8.2f}x"
        )
    return results


def _met(ratio: float) -> str:
    return "met" if ratio <= FLOOR_GOAL else "NOT met"


def run_range_check(profile: str, data: list[dict], rounds: int) -> float:
    """Time ratio (with / without) of decode+check over the encoded payloads; 1.05 means the check costs 5 %."""
    urn, queue = "urn:babel:orders:created", "orders"
    bodies = [bq.encode(bq.make_envelope(urn, d, queue_name=queue)) for d in data]
    n = len(bodies)

    def without_check() -> int:
        decode, check = decode_without_range_check, bq.check
        return sum(check(decode(b)) is None for b in bodies)

    def with_check() -> int:
        decode, check = bq.decode, bq.check
        return sum(check(decode(b)) is None for b in bodies)

    def orjson_path() -> int:
        decode, check = read_on_orjson, bq.check
        return sum(check(decode(b)) is None for b in bodies)

    assert without_check() == with_check() == orjson_path() == n, "all must accept every body"
    t_without, t_with, t_orjson = best_interleaved(rounds, (without_check, with_check, orjson_path))
    ratio = t_with / t_without
    print(f"{profile:<8} {n / t_without:>14,.0f} {n / t_with:>14,.0f} {ratio:>10.3f}x "
          f"{n / t_orjson:>18,.0f} {t_orjson / t_without:>10.3f}x")
    return ratio


def run_profile(
    data: list[dict], rounds: int, floors: list[tuple[str, str, float, float, float]] | None = None
) -> dict[str, float]:
    """Print and return the SDK speed ratio (SDK time / ours) per workload; when ``floors`` is given, also time
    each workload's floor in the same run and append ``(profile, workload, ours, floor, sdk)`` in us/msg."""
    n = len(data)
    urn, queue = "urn:babel:orders:created", "orders"
    profile = "small" if len(data[0]) == 2 else "rich"

    def ours_make_encode() -> list[bytes]:
        make, encode = bq.make_envelope, bq.encode
        return [encode(make(urn, d, queue_name=queue)) for d in data]

    def sdk_make_encode() -> list[bytes]:
        make, encode = EnvelopeCodec.make, EnvelopeCodec.encode
        return [encode(make(urn, d, queue=queue)).encode() for d in data]

    def floor_make_encode() -> list[bytes]:
        dumps, uuid4, time_ns = orjson.dumps, uuid.uuid4, time.time_ns
        return [
            dumps(
                {
                    "job": urn,
                    "trace_id": str(uuid4()),
                    "data": d,
                    "meta": {
                        "id": str(uuid4()),
                        "queue": queue,
                        "lang": "python",
                        "schema_version": 1,
                        "created_at": time_ns() // 1_000_000,
                    },
                    "attempts": 0,
                }
            )
            for d in data
        ]

    bodies = ours_make_encode()

    def ours_decode_check() -> int:
        decode, check = bq.decode, bq.check
        return sum(check(decode(b)) is None for b in bodies)

    def sdk_decode_check() -> int:
        decode, accepts = EnvelopeCodec.decode, EnvelopeCodec.accepts
        return sum(accepts(decode(b)) for b in bodies)

    def floor_decode_check() -> int:
        loads = orjson.loads
        return sum(loads(b) is not None for b in bodies)

    assert ours_decode_check() == sdk_decode_check() == floor_decode_check() == n, "all must read every body"
    _assert_same_shape(bodies[0], floor_make_encode()[0])
    results = {}
    for name, ours, sdk, floor in (
        ("make+encode", ours_make_encode, sdk_make_encode, floor_make_encode),
        ("decode+check", ours_decode_check, sdk_decode_check, floor_decode_check),
    ):
        sides = (ours, sdk, floor) if floors is not None else (ours, sdk)
        t_ours, t_sdk, *t_floor = best_interleaved(rounds, sides)
        ratio = t_sdk / t_ours
        results[name] = ratio
        print(f"{profile:<8} {name:<14} {n / t_ours:>14,.0f} {n / t_sdk:>14,.0f} {ratio:>7.2f}x")
        if floors is not None:
            floors.append((profile, name, t_ours / n * 1e6, t_floor[0] / n * 1e6, t_sdk / n * 1e6))
    return results


def _assert_same_shape(ours: bytes, floor: bytes) -> None:
    """The make+encode floor writes the same keys, in the same order, and the same payload as ours."""
    a, b = orjson.loads(ours), orjson.loads(floor)
    assert list(a) == list(b) and list(a["meta"]) == list(b["meta"]), (list(a), list(b))
    assert a["data"] == b["data"] and a["job"] == b["job"] and a["meta"]["queue"] == b["meta"]["queue"]


if __name__ == "__main__":
    main()
