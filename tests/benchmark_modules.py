"""The benchmark scripts as modules, for the tests that run them at a CI size (``benchmarks/`` is not a package:
each script is run by path, as its documented command does)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

__all__ = ["load_benchmark"]

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> Any:
    """``benchmarks/<name>.py`` loaded once per process under its own name (its dataclasses need an entry in
    ``sys.modules``; a second load gives the module already there)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
