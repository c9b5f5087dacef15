"""Replaying dead letters once per ledger: selection, the replay engine and its input feeds. No Airflow here."""

from __future__ import annotations

from .feeds import (
    FileList,
    feed_from_browse,
    feed_from_dead_letters,
    feed_from_replay_set,
    iter_replay_set,
    local_files,
    skip_part,
)
from .replayer import BYPASS_HEADER, Item, Replayer, ReplayResult, copy_digest
from .selection import Selection, original_queue_of

__all__ = [
    "BYPASS_HEADER",
    "FileList",
    "Item",
    "ReplayResult",
    "Replayer",
    "Selection",
    "copy_digest",
    "feed_from_browse",
    "feed_from_dead_letters",
    "feed_from_replay_set",
    "iter_replay_set",
    "local_files",
    "original_queue_of",
    "skip_part",
]
