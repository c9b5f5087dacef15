"""Exceptions raised by airflow-provider-babelqueue.

Every error the package raises on purpose derives from :class:`BabelQueueError`, so a DAG author can catch
the whole family in one ``except``. The envelope errors are also :class:`ValueError` subclasses because
they describe bad *values* (a blank URN, a NaN in ``data``, a body that is not JSON).

Pure module: standard library only.
"""

from __future__ import annotations

__all__ = [
    "BabelQueueError",
    "EnvelopeDecodeError",
    "EnvelopeEncodeError",
    "EnvelopeError",
    "InvalidEnvelopeError",
]


class BabelQueueError(Exception):
    """Base class of every error raised by this package."""


class EnvelopeError(BabelQueueError, ValueError):
    """Base class of the envelope core's errors."""


class InvalidEnvelopeError(EnvelopeError):
    """An envelope cannot be built from the given arguments (blank URN, ``data`` that is not an object)."""


class EnvelopeEncodeError(EnvelopeError):
    """An envelope cannot be written as contract JSON (NaN/Infinity, integer outside signed 64-bit,
    a value of a type JSON has no form for)."""


class EnvelopeDecodeError(EnvelopeError):
    """A body is not an envelope-shaped JSON document (invalid UTF-8, invalid JSON, not an object).

    Such a body is *poison*: consumers dead-letter it with reason ``poison`` and keep its raw bytes.
    """
