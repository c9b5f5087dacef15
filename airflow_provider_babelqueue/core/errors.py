"""The one exception tree of airflow-provider-babelqueue.

Every error the package raises on purpose derives from :class:`BabelQueueError`, so a DAG author can catch
the whole family in one ``except``::

    BabelQueueError
    ├── EnvelopeError (also ValueError): InvalidEnvelopeError, EnvelopeEncodeError, EnvelopeDecodeError
    ├── BindingError: NotSupportedError, MissingExtraError (also ImportError), PublishBatchError
    └── ConnectionConfigError (also ValueError): a connection field or extra the hook cannot use

The envelope errors are also :class:`ValueError` subclasses because they describe bad *values* (a blank URN,
a NaN in ``data``, a body that is not JSON); so is the hooks' :class:`ConnectionConfigError`.

Pure module: standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "BabelQueueError",
    "BindingError",
    "ConnectionConfigError",
    "EnvelopeDecodeError",
    "EnvelopeEncodeError",
    "EnvelopeError",
    "InvalidEnvelopeError",
    "MissingExtraError",
    "NotSupportedError",
    "PublishBatchError",
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


class BindingError(BabelQueueError):
    """A broker operation failed; the message says which queue and what to check."""


class NotSupportedError(BindingError):
    """The broker cannot do this (e.g. a non-destructive browse of its dead-letter queue)."""


class MissingExtraError(BindingError, ImportError):
    """The broker's client library is not installed; the message names the extra to install."""


class PublishBatchError(BindingError):
    """Part of a batch was not delivered.

    :ivar failed: indexes (into the batch) of the bodies that were not delivered; everything else was.
    """

    def __init__(self, message: str, failed: Sequence[int]) -> None:
        super().__init__(message)
        self.failed = list(failed)


class ConnectionConfigError(BabelQueueError, ValueError):
    """A connection field or extra has a value the hook cannot use; the message names the field.

    A :class:`ValueError` too: it describes a bad value, and callers that caught ``ValueError`` keep working.
    """
