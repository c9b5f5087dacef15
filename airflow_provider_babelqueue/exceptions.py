"""The exception tree at its documented path: :mod:`airflow_provider_babelqueue.core.errors` is the module."""

from __future__ import annotations

import sys

from .core import errors as _errors

sys.modules[__name__] = _errors
