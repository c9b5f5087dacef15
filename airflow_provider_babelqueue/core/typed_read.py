"""A JSON reader that refuses integers outside signed 64-bit while it parses: the fast path of ``decode``.

orjson cannot be asked whether a literal was an integer outside signed 64-bit (it reads ``2**64`` and beyond as
a float), so :func:`~.envelope.decode` has to scan the body's bytes for such literals (:mod:`.integers`): a
fixed cost on every body, larger than the checks the contract asks of an envelope. msgspec, given the type "a
JSON object whose integers fit signed 64-bit", refuses those literals inside its own parse and costs about what
orjson's parse does, so the scan disappears from the common path.

msgspec's type system has no recursive JSON type, so the type is unrolled to :data:`DEPTH` levels below the
top-level object; a body nested deeper is refused here and read by the orjson path, as is every body this
reader refuses for any reason. A refusal never decides an outcome: the orjson path gives the result (or the
error, with its message) for such a body. This reader only answers for bodies it accepts, and for those it
gives exactly the value the orjson path gives (same keys in the same order, the last of repeated keys
winning, same ints and floats): the tests compare the two on hostile inputs.

msgspec is a declared dependency of the provider; where it is missing (a Spark driver in cluster mode given only the
package's zip, say), :data:`read_checked` refuses every body, and every body goes the orjson path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Union

from .integers import INT64_MAX, INT64_MIN

__all__ = ["DEPTH", "READ_ERRORS", "Unavailable", "read_checked"]

#: Levels of nesting below the envelope's object the fast path reads (``data`` is level 1, a customer object
#: inside it level 2, ...). Deeper bodies are read on orjson, correctly, in about twice the time. msgspec
#: builds its type tree without sharing, so each level doubles the reader's construction at import (8 levels:
#: about 10 ms; 12: 0.2 s), not its speed; 8 is deeper than every body in the contract's examples and in the
#: captures from the official SDKs.
DEPTH = 8

read_checked: Callable[[Any], dict[str, Any]]
READ_ERRORS: tuple[type[BaseException], ...]


class Unavailable(Exception):
    """Raised by :data:`read_checked` where msgspec is not installed: every body goes the orjson path."""


def _unavailable(body: Any) -> dict[str, Any]:
    raise Unavailable


try:
    import msgspec
except ImportError:  # exercised by the test that hides msgspec
    read_checked = _unavailable
    READ_ERRORS = (Unavailable,)
else:

    def _object_type(depth: int) -> Any:
        """A JSON object whose values go ``depth`` levels deep: objects and arrays hold values one level
        shallower, the last level holds scalars only; every integer within signed 64-bit."""
        int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
        value: Any = Union[str, int64, float, bool, None]  # noqa: UP007 - a runtime type for msgspec
        for _ in range(depth):
            value = Union[dict[str, value], list[value], str, int64, float, bool, None]  # noqa: UP007
        return dict[str, value]

    read_checked = msgspec.json.Decoder(_object_type(DEPTH)).decode
    #: msgspec's own errors (invalid JSON, a value outside the type), ``TypeError`` for an input that is not
    #: bytes-like or str, ``ValueError`` for a str holding a lone surrogate (it cannot be encoded as UTF-8):
    #: each sends the body to the orjson path, which names the fault.
    READ_ERRORS = (msgspec.MsgspecError, TypeError, ValueError)
