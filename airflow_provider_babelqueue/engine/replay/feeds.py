"""What a replay reads: a DLQ by reservation (redrive) or by browse (dry run), or a replay-set file or folder.

A queue's "DLQ" is every dead-letter queue its binding reads for it (``Binding.dead_letter_sources``: the
spec's name and the ``<queue>.dlq`` of the official SDKs' workers): the binding's reads span them in order, and
each reservation is acked or released on the queue it came from.
"""

from __future__ import annotations

import gzip
import logging
import os
from collections.abc import Callable, Iterator
from typing import IO
from urllib.parse import urlsplit

from ...bindings.base import Binding
from ...core.records import parse_replay_line
from ..logs import DEFAULT_MESSAGE_LOG_LINES, LineBudget, Log
from .replayer import Item, Replayer

__all__ = [
    "FileList",
    "feed_from_browse",
    "feed_from_dead_letters",
    "feed_from_replay_set",
    "iter_replay_set",
    "local_files",
    "skip_part",
]

logger = logging.getLogger(__name__)

#: The files of a replay set: (display name, opener) per file. URLs need a lister (see :func:`iter_replay_set`),
#: e.g. one built on Airflow's ``ObjectStoragePath``.
FileList = list[tuple[str, Callable[[], IO[bytes]]]]


def feed_from_dead_letters(replayer: Replayer, binding: Binding, queue_name: str, reserve_timeout: float) -> None:
    """Redrive: reserve DLQ messages a batch at a time (``reserve_dead_letters``, never past what
    ``max_messages`` could still use, from each dead-letter source in turn) until every source is empty or
    ``max_messages`` are planned. Messages not replayed stay reserved until the run ends (so the loop moves past
    them), then are released to the source they came from."""
    settled = False
    while not replayer.full:
        messages = binding.reserve_dead_letters(queue_name, replayer.room(), timeout=reserve_timeout)
        if not messages:
            # What we hold may hide the rest of the DLQ (SQS FIFO groups): publish and ack it, then look again.
            if settled or not replayer.unsettled or not binding.dead_letters_hidden_while_held(queue_name):
                return
            replayer.flush()
            settled = True
            continue
        settled = False
        start = replayer.taken
        try:
            for message in messages:
                replayer.feed(Item(message.body, queue_name, message, True))
        except BaseException:
            replayer.hold(messages[replayer.taken - start:])  # the unfed rest goes back with everything else
            raise


def feed_from_browse(replayer: Replayer, binding: Binding, queue_name: str, window: int = 1000) -> None:
    """Dry run on a broker that can browse: read the DLQ (every dead-letter source, in the binding's order) in
    growing windows, touching nothing."""
    seen, limit = 0, max(window, binding.dead_letter_depth(queue_name) + 1)
    while not replayer.full:
        batch = binding.browse_dead_letters(queue_name, limit=limit)
        for message in batch[seen:]:
            if replayer.full:
                return
            replayer.feed(Item(message.body, queue_name, None, True))
        seen = max(seen, len(batch))
        if len(batch) < limit:
            return
        limit *= 2


def skip_part(name: str) -> bool:
    """Whether a replay-set folder entry is bookkeeping, not data (``_SUCCESS``, hidden, ``.crc``)."""
    return name.startswith(("_", ".")) or name.endswith(".crc")


def _file_opener(path: str) -> Callable[[], IO[bytes]]:
    """Opens ``path`` for binary reading when called."""
    return lambda: open(path, "rb")


def local_files(replay_set: str) -> FileList:
    """Files of a local replay set: one file, or every file under a folder (sorted; ``_SUCCESS``, hidden and
    ``.crc`` files skipped, as Spark writes them)."""
    root = os.path.expanduser(replay_set)
    if os.path.isdir(root):
        found: list[str] = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not skip_part(d))
            found.extend(os.path.join(folder, n) for n in sorted(names) if not skip_part(n))
        return [(path, _file_opener(path)) for path in found]
    if not os.path.exists(root):
        raise FileNotFoundError(f"replay set {replay_set} does not exist")
    return [(root, lambda: open(root, "rb"))]


def iter_replay_set(replay_set: str, log: Log | None = None, *,
                    url_files: Callable[[str], FileList] | None = None) -> Iterator[Item | str]:
    """Items of a replay set, or the string ``"unreadable_line"`` for a line that cannot be used (a torn
    last line after a crash, a foreign record version). ``.gz`` files are decompressed.

    :param replay_set: a local file or folder, or a URL (``file://`` included) that ``url_files`` lists.
    :param url_files: lists the files of a URL (the operator passes one built on Airflow's
        ``ObjectStoragePath``); without it a URL is refused.
    """
    log = log or logger
    if len(urlsplit(replay_set).scheme) <= 1:  # a local path ("C:" is a drive)
        files = local_files(replay_set)
    elif url_files is None:
        raise ValueError(f"replay set {replay_set} is a URL; pass url_files to list its files")
    else:
        files = url_files(replay_set)
    lines = LineBudget(log, DEFAULT_MESSAGE_LOG_LINES)  # a corrupt file: the first lines a minute, then a count
    try:
        for name, opener in files:
            with opener() as raw:
                stream: IO[bytes] | gzip.GzipFile = gzip.GzipFile(fileobj=raw) if name.endswith(".gz") else raw
                for number, line in enumerate(stream, 1):
                    try:
                        parsed = parse_replay_line(line)
                    except ValueError as exc:
                        if lines.allow("unusable replay-set"):
                            log.warning("replay set %s line %d is unusable and is skipped: %s", name, number, exc)
                        yield "unreadable_line"
                        continue
                    if parsed is not None:
                        yield Item(parsed.body, parsed.queue_name)
    finally:
        lines.flush()


def feed_from_replay_set(replayer: Replayer, replay_set: str, *,
                         url_files: Callable[[str], FileList] | None = None) -> None:
    """Feed every line of a replay set (see :func:`iter_replay_set`) until ``max_messages`` are planned."""
    for item in iter_replay_set(replay_set, replayer.log, url_files=url_files):
        if replayer.full:
            return
        if isinstance(item, str):
            replayer.result.skipped[item] = replayer.result.skipped.get(item, 0) + 1
            continue
        replayer.feed(item)
