"""The envelope codec benchmark at a CI size (``benchmarks/bench_envelope.py``, part of ``make bench``), so its
code keeps running and its own checks keep holding between the runs that give the figures: every side (ours,
the official SDK, the floors, both decode paths) reads and accepts every body, and each goal row is printed.
The ratios are printed, never asserted: 2,000 envelopes measure the machine's noise (docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from tests.benchmark_modules import load_benchmark


def test_the_envelope_benchmark_prints_every_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    results = load_benchmark("bench_envelope").main(["--n", "2000", "--rounds", "2"])
    out = capsys.readouterr().out
    for profile in ("small", "rich"):
        for workload in ("make+encode", "decode+check"):
            assert results[f"{profile}/{workload}"] > 0
            assert results[f"{profile}/{workload}/floor"] > 0
            assert f"{workload:<14} {profile:<8}" in out.split("summary:", 1)[1]
    for profile in ("small", "rich", "digits"):
        assert results[f"{profile}/range-check"] > 0
    assert "orjson path msg/s" in out
