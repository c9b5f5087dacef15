"""The envelope API at its documented path: :mod:`airflow_provider_babelqueue.core.envelope` is the module."""

from __future__ import annotations

import sys

from .core import envelope as _envelope

sys.modules[__name__] = _envelope
