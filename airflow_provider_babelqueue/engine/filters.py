"""Message filters: which messages a trigger, a consumer or a sensor takes, by URN and by a JSONPath over ``data``.

A filter decides on the decoded envelope alone, so every caller applies the same rule. A message the filter does
not take is *handed back* to its queue unchanged (:meth:`~..bindings.base.Binding.hand_back`), never acked and
never dead-lettered: another consumer, with another filter, may be the one it is meant for.

* ``urns``: shell-style patterns (``order.*``, ``invoice.created``) matched case-sensitively against the URN;
  a message matches when any pattern does.
* ``jsonpath``: an RFC 9535 JSONPath evaluated with the payload (``data``) as its root ``$``; a message matches
  when the query selects at least one node. A field's presence: ``$.coupon``; a condition inside a list:
  ``$.items[?@.qty > 2]``; a condition on a top-level field, through the root inside a filter (RFC 9535 applies
  filters to an object's members, not to the object itself): ``$[?$.amount > 100 && $.currency == 'EUR']``.

Both set: both must match. An undecodable body (poison) or one that fails validation matches no filter that is
set, so such a body is never taken by a filtered reader; an unfiltered consumer dead-letters it as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import jsonpath

from ..core import envelope as bq

__all__ = ["MessageFilter", "message_filter"]


@dataclass(frozen=True)
class MessageFilter:
    """A URN and payload filter, compiled once (an invalid JSONPath fails when the DAG is parsed, not per message).

    :param urns: URN patterns (``fnmatch`` syntax, case-sensitive); empty: every URN.
    :param jsonpath: an RFC 9535 query over ``data``; ``None``: every payload.
    """

    urns: tuple[str, ...] = ()
    jsonpath: str | None = None
    _query: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.urns, str):
            object.__setattr__(self, "urns", (self.urns,))
        else:
            object.__setattr__(self, "urns", tuple(self.urns))
        for pattern in self.urns:
            if not isinstance(pattern, str) or not pattern.strip():
                raise ValueError(f"A URN filter must be a non-empty string pattern, got {pattern!r}.")
        if self.jsonpath is not None:
            if not isinstance(self.jsonpath, str) or not self.jsonpath.strip():
                raise ValueError(f"A JSONPath filter must be a non-empty string, got {self.jsonpath!r}.")
            try:
                query = jsonpath.compile(self.jsonpath)
            except jsonpath.JSONPathError as exc:
                raise ValueError(
                    f"The JSONPath filter {self.jsonpath!r} is not valid RFC 9535: {exc}. A condition on a top-level "
                    "field is written $[?$.amount > 100]; one inside a list $.items[?@.qty > 2]."
                ) from None
            object.__setattr__(self, "_query", query)

    @property
    def active(self) -> bool:
        """Whether the filter restricts anything (an empty filter takes every message, poison included)."""
        return bool(self.urns) or self.jsonpath is not None

    def matches(self, envelope: Mapping[str, Any] | None) -> bool:
        """Whether the filter takes the message whose decoded envelope is ``envelope`` (``None``: undecodable)."""
        if not self.active:
            return True
        if envelope is None or bq.check(envelope) is not None:
            return False
        return self.matches_fields(envelope)

    def matches_fields(self, envelope: Mapping[str, Any] | None) -> bool:
        """:meth:`matches` without its validity gate: the URN and ``data`` alone (``data`` that is not an object
        reads as ``{}``). For dead letters, kept because they broke a rule yet still orders by their URN."""
        if not self.active:
            return True
        if envelope is None:
            return False
        if self.urns:
            urn = bq.urn_of(envelope)
            if not any(fnmatchcase(urn, pattern) for pattern in self.urns):
                return False
        if self._query is not None:
            return self._query.match(bq.data_of(envelope)) is not None
        return True

    def describe(self) -> str:
        """A short text for logs and task summaries."""
        parts = []
        if self.urns:
            parts.append("urn in " + ", ".join(self.urns))
        if self.jsonpath is not None:
            parts.append(f"data matches {self.jsonpath}")
        return " and ".join(parts) or "every message"

    def as_kwargs(self) -> dict[str, Any]:
        """The filter as the ``urns`` / ``jsonpath`` keyword arguments it was built from (for serialisation)."""
        return {"urns": list(self.urns) or None, "jsonpath": self.jsonpath}


def message_filter(urns: str | Sequence[str] | None = None, jsonpath: str | None = None) -> MessageFilter:
    """A :class:`MessageFilter` from operator or trigger arguments (``None`` and empty mean "no restriction")."""
    if isinstance(urns, str):
        urns = [urns]
    return MessageFilter(tuple(urns or ()), jsonpath or None)
