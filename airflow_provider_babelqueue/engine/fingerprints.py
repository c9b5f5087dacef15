"""Dead letters grouped by error fingerprint: the new-fingerprint check behind the dead-letter sensor and trigger
(``fire_on="new_fingerprint"``) and the DLQ summary the dead-letter notifier posts.

The fingerprint is :mod:`~airflow_provider_babelqueue.core.fingerprint`'s, the one the Spark triage writes, so an
alert names the same fingerprint as the triage report. Dead letters are read with ``browse_dead_letters``, which
removes nothing (brokers that cannot browse raise ``NotSupportedError``); the fingerprints already reported are
kept in a persistent seen-set (``Binding.seen_store``: a SQL table or a Redis set), so a restarted trigger does
not report them again.

Like :mod:`.checks`, pure over the binding protocol: no Airflow import; the sensor calls these in ``poke``, the
trigger from its broker thread, so every mode decides the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..bindings.base import Binding, NotSupportedError
from ..bindings.message import ReceivedMessage
from ..core.fingerprint import read_dead_letter
from ..core.idempotency import SeenStore, remember_many, seen_many
from .checks import _read_dead_letter, dead_letter_matches
from .filters import message_filter

__all__ = [
    "BROWSE_LIMIT",
    "FIRE_ON",
    "MAX_LISTED",
    "SAMPLE_ERROR_CHARS",
    "DeadLetterGroups",
    "FingerprintGroup",
    "NewFingerprintStatus",
    "default_store_name",
    "dead_letter_summary",
    "fingerprint_groups",
    "group_messages",
    "judge_new",
    "known_fingerprints",
    "remember_fingerprints",
    "validate_fire_on",
]

#: What fires the dead-letter sensor and trigger: dead letters arriving (the depth or the matching count), or a
#: dead letter whose error fingerprint was never reported before.
FIRE_ON = ("arrival", "new_fingerprint")
#: Dead letters read per check (the oldest ones, in the broker's reading order): bounds each poll's cost.
BROWSE_LIMIT = 1000
#: Fingerprints detailed in one event or summary at most (their total is always given).
MAX_LISTED = 100
#: Characters of a sample error text carried in a summary.
SAMPLE_ERROR_CHARS = 500


def validate_fire_on(fire_on: str) -> str:
    if fire_on not in FIRE_ON:
        raise ValueError(f"fire_on must be one of {', '.join(map(repr, FIRE_ON))}, got {fire_on!r}")
    return fire_on


def default_store_name(queue_name: str) -> str:
    """The seen-set holding the reported fingerprints of ``queue_name``'s DLQ unless one is named."""
    return f"dlq-fingerprints:{queue_name}"


@dataclass(frozen=True, slots=True)
class FingerprintGroup:
    """The browsed dead letters sharing one fingerprint, with the first one's details as the sample.

    :ivar count: how many of the browsed (and matching) dead letters have it.
    :ivar meta_id: the sample's ``meta.id`` (``""`` for poison); ``urn`` and ``reason`` likewise, as the
        dead-letter sensor's samples read them.
    :ivar error: the sample's error text (not masked), for a human reading a summary.
    """

    fingerprint: str
    count: int
    meta_id: str
    urn: str
    reason: str | None
    exception_type: str | None
    error_pattern: str | None
    error: str | None = None

    def sample(self) -> dict[str, Any]:
        return {"meta_id": self.meta_id, "urn": self.urn, "reason": self.reason,
                "exception_type": self.exception_type, "error_pattern": self.error_pattern}

    def as_dict(self) -> dict[str, Any]:
        """``{"fingerprint", "count", "sample"}`` for an event."""
        return {"fingerprint": self.fingerprint, "count": self.count, "sample": self.sample()}


@dataclass(frozen=True, slots=True)
class DeadLetterGroups:
    """One read of a DLQ: ``depth`` (the broker's count), ``browsed`` (dead letters read), ``matching`` (those
    passing the filters), the groups (most frequent first, ties in reading order), the matching dead letters per
    reason and per dead-letter source."""

    depth: int
    browsed: int
    matching: int
    groups: list[FingerprintGroup]
    by_reason: dict[str, int] = field(default_factory=dict)
    by_source: dict[str, int] = field(default_factory=dict)


def group_messages(messages: Iterable[ReceivedMessage], *, reasons: Sequence[str] | None = None,
                   urns: str | Sequence[str] | None = None, jsonpath: str | None = None
                   ) -> tuple[int, list[FingerprintGroup], dict[str, int], dict[str, int]]:
    """Group browsed dead letters by fingerprint: ``(matching, groups, by_reason, by_source)``.

    The filters mean what they mean for the dead-letter sensor (:func:`.checks.dead_letter_status`): exact
    reasons, URN patterns, a JSONPath over ``data``; all that are set must match.
    """
    chosen = message_filter(urns, jsonpath)
    counts: dict[str, int] = {}
    firsts: dict[str, FingerprintGroup] = {}
    by_reason: dict[str, int] = {}
    by_source: dict[str, int] = {}
    matching = 0
    for message in messages:
        entry, envelope = _read_dead_letter(message)
        if reasons and entry["reason"] not in reasons:
            continue
        if not dead_letter_matches(chosen, envelope):
            continue
        matching += 1
        facts = read_dead_letter(message.body, message.envelope)
        key = facts.fingerprint
        counts[key] = counts.get(key, 0) + 1
        if key not in firsts:
            error = facts.error[:SAMPLE_ERROR_CHARS] if facts.error is not None else None
            firsts[key] = FingerprintGroup(key, 0, entry["meta_id"], entry["urn"], entry["reason"],
                                           facts.exception_type, facts.error_pattern, error)
        reason = str(entry["reason"] if entry["reason"] is not None else facts.reason)
        by_reason[reason] = by_reason.get(reason, 0) + 1
        if message.dead_letter_source is not None:
            by_source[message.dead_letter_source] = by_source.get(message.dead_letter_source, 0) + 1
    order = {key: index for index, key in enumerate(firsts)}
    groups = [_with_count(firsts[key], counts[key]) for key in sorted(firsts, key=lambda k: (-counts[k], order[k]))]
    return matching, groups, by_reason, by_source


def _with_count(group: FingerprintGroup, count: int) -> FingerprintGroup:
    return FingerprintGroup(group.fingerprint, count, group.meta_id, group.urn, group.reason, group.exception_type,
                            group.error_pattern, group.error)


def _require_browse(binding: Binding, what: str) -> None:
    if not binding.can_browse:
        raise NotSupportedError(
            f"{what} needs a broker that can read its dead-letter queue without removing messages; the "
            f"{binding.name} binding cannot (SQL, Redis and Azure Service Bus can)"
        )


def fingerprint_groups(binding: Binding, queue_name: str, *, reasons: Sequence[str] | None = None,
                       urns: str | Sequence[str] | None = None, jsonpath: str | None = None,
                       browse_limit: int = BROWSE_LIMIT) -> DeadLetterGroups:
    """Read the DLQ's first ``browse_limit`` dead letters and then its depth (nothing is removed) and group them.

    :raises NotSupportedError: the broker cannot browse its DLQ (RabbitMQ, SQS, Pulsar).
    """
    _require_browse(binding, "fire_on='new_fingerprint'")
    messages = binding.browse_dead_letters(queue_name, browse_limit)
    # read after the browse, so a dead letter landing between the two reads never makes the depth smaller than
    # what was read (a drain between them could: the DLQ held at least what the browse returned)
    depth = max(binding.dead_letter_depth(queue_name), len(messages))
    matching, groups, by_reason, by_source = group_messages(messages, reasons=reasons, urns=urns, jsonpath=jsonpath)
    return DeadLetterGroups(depth, len(messages), matching, groups, by_reason, by_source)


def _store(binding: Binding, name: str) -> SeenStore:
    try:
        return binding.seen_store(name)
    except NotSupportedError:
        raise NotSupportedError(
            f"the {binding.name} binding cannot keep the known fingerprints; pass fingerprint_conn_id, a "
            "babelqueue+sql or babelqueue+redis connection that keeps them"
        ) from None


def known_fingerprints(binding: Binding, name: str, fingerprints: Iterable[str]) -> set[str]:
    """The fingerprints among ``fingerprints`` that the seen-set ``name`` on ``binding`` holds (one round trip)."""
    return seen_many(_store(binding, name), fingerprints)


def remember_fingerprints(binding: Binding, name: str, fingerprints: Iterable[str]) -> None:
    """Add ``fingerprints`` to the seen-set ``name`` on ``binding`` (persistent: the SQL table or Redis set)."""
    remember_many(_store(binding, name), fingerprints)


@dataclass(frozen=True, slots=True)
class NewFingerprintStatus:
    """Whether dead letters with a fingerprint never reported before are there.

    :ivar new: the groups of new fingerprints with at least ``min_count`` dead letters (most frequent first).
    :ivar known: how many distinct fingerprints among those browsed were reported before.
    :ivar unreported: every browsed fingerprint not reported before, ``new`` ones included (a learning first
        observation remembers them all).
    """

    matched: bool
    read: DeadLetterGroups
    new: list[FingerprintGroup]
    known: int
    unreported: list[str]

    @property
    def fingerprints(self) -> list[str]:
        """The fingerprints to remember once the event is out."""
        return [group.fingerprint for group in self.new]

    def as_dict(self, sample_size: int = 5) -> dict[str, Any]:
        """The event payload's counts and fingerprints (the trigger adds ``status``, ``queue_name``...)."""
        listed = self.new[:MAX_LISTED]
        return {
            "depth": self.read.depth,
            "browsed": self.read.browsed,
            "matching": self.read.matching,
            "new": sum(group.count for group in self.new),
            "new_fingerprint_count": len(self.new),
            "known_fingerprints": self.known,
            "new_fingerprints": [group.as_dict() for group in listed],
            "sample": [group.sample() for group in listed[: max(sample_size, 0)]],
        }


def judge_new(read: DeadLetterGroups, known: set[str], *, min_count: int = 1) -> NewFingerprintStatus:
    """Which of the groups are new: fingerprints not in ``known`` with at least ``min_count`` dead letters (a
    new fingerprint with fewer is neither reported nor remembered, so it fires once it has enough)."""
    if min_count < 1:
        raise ValueError(f"min_count must be at least 1, got {min_count}")
    unreported = [group for group in read.groups if group.fingerprint not in known]
    new = [group for group in unreported if group.count >= min_count]
    return NewFingerprintStatus(bool(new), read, new, len(read.groups) - len(unreported),
                                [group.fingerprint for group in unreported])


def dead_letter_summary(binding: Binding, queue_names: Sequence[str], *, top: int = 10,
                        browse_limit: int = BROWSE_LIMIT) -> dict[str, Any]:
    """A DLQ summary for a notification: per queue its depth, and (where the broker can browse) the counts by
    reason and by dead-letter source and the top fingerprints of its first ``browse_limit`` dead letters, each with
    a sample error. A broker that cannot browse gives the depths alone (``browsable`` ``False``).

    :param queue_names: the queues whose DLQs are summarised, in this order.
    :param top: fingerprints listed per queue (most frequent first).
    """
    queues: list[dict[str, Any]] = []
    for queue_name in queue_names:
        depth = binding.dead_letter_depth(queue_name)
        entry: dict[str, Any] = {"queue_name": queue_name, "depth": depth, "browsable": binding.can_browse,
                                 "browsed": 0, "by_reason": {}, "by_source": {}, "fingerprint_count": 0,
                                 "top_fingerprints": []}
        if binding.can_browse and depth:
            messages = binding.browse_dead_letters(queue_name, browse_limit)
            _, groups, by_reason, by_source = group_messages(messages)
            entry.update(
                browsed=len(messages),
                by_reason=dict(sorted(by_reason.items(), key=lambda item: (-item[1], item[0]))),
                by_source=by_source,
                fingerprint_count=len(groups),
                top_fingerprints=[_summary_group(group) for group in groups[: max(top, 0)]],
            )
        queues.append(entry)
    totals: dict[str, int] = {}
    for entry in queues:
        for reason, count in entry["by_reason"].items():
            totals[reason] = totals.get(reason, 0) + count
    return {
        "total_depth": sum(entry["depth"] for entry in queues),
        "by_reason": dict(sorted(totals.items(), key=lambda item: (-item[1], item[0]))),
        "queues": queues,
    }


def _summary_group(group: FingerprintGroup) -> Mapping[str, Any]:
    return {"fingerprint": group.fingerprint, "count": group.count, "exception_type": group.exception_type,
            "error_pattern": group.error_pattern, "sample_error": group.error, "sample_meta_id": group.meta_id,
            "sample_urn": group.urn, "reason": group.reason}
