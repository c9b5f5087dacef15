"""The SQL binding's reads of its dead-letter tables for a console, and its discard: the queues the tables hold,
pages by position, a whole-queue read after a row id, the last hour's count, and removing chosen dead letters.
Each function takes the :class:`~.binding.SqlBinding` whose methods of the same names call it.

A console reads what every other reader gets (:func:`reader_body`): a row stored bare, with its reason, error and
time in the columns (a poison body, one refused by a limit), reads in the form the other brokers' DLQs hold, so
a page shows the error the consumer wrote, not only that the bytes are unreadable; a discard finds the row by
those same bytes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson
import sqlalchemy as sa

from ...core.frames import FRAME_KEY
from ...core.integers import may_hold_wide_integer
from ...core.peer import poison_wrapper
from ..bodies import dead_letter_view
from ..message import parse_body

if TYPE_CHECKING:
    from .binding import SqlBinding

__all__ = ["browse_dead_letter_bytes", "dead_letter_bytes_after", "dead_letters_failed_since", "discard_dead_letters",
           "queue_names", "reader_body"]

#: Bodies per transaction of a console's discard.
DISCARD_BATCH = 500


def reader_body(body: bytes, row: Any, envelope: dict[str, Any] | None = None, *, decoded: bool = False) -> bytes:
    """The bytes a reader gets for a dead-letter row holding ``body``: the body itself when it carries its
    ``dead_letter`` block, else (stored bare, the reason in the columns) the view
    :func:`~..bodies.dead_letter_view` builds from the row's ``reason``, ``queue``, ``attempts``, ``error``,
    ``exception`` and ``failed_at``.

    :param envelope: ``body`` decoded, when the caller has it (``decoded=True``; ``None`` then means not an
        envelope); else it is decoded here.
    """
    if not decoded:
        if _annotated(body):
            return body
        envelope = parse_body(body)[0]
    return dead_letter_view(body, envelope, row.reason or "unknown", original_queue=row.queue,
                            attempts=row.attempts or 0, error=row.error, exception=row.exception,
                            failed_at=row.failed_at)


def _annotated(body: bytes) -> bool:
    """Whether ``body`` is an envelope carrying its ``dead_letter`` block, as :func:`~..message.parse_body` would
    find it (an object with the key, no header frame, no integer outside signed 64-bit), for the common row at
    the cost of one parse: most rows are stored annotated, and a page reads thousands."""
    if b'"dead_letter"' not in body:
        return False
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return (value.__class__ is dict and "dead_letter" in value and FRAME_KEY not in value
            and not may_hold_wide_integer(body))


def _columns(t: sa.Table) -> tuple[sa.ColumnElement[Any], ...]:
    """What :func:`reader_body` reads of a row, after its payload."""
    return (t.c.payload, t.c.reason, t.c.queue, t.c.attempts, t.c.error, t.c.exception, t.c.failed_at)


def queue_names(binding: SqlBinding, limit: int = 200) -> list[str]:
    """The distinct ``queue`` values of the ready table and the dead-letter tables (read by their
    ``(queue, ...)`` indexes), sorted."""
    names: set[str] = set()
    for t in [binding._ready, *binding._readable()]:
        query = sa.select(t.c.queue).distinct().order_by(t.c.queue).limit(limit)
        with binding._guard("list queues", None), binding._read() as conn:
            names.update(row[0] for row in conn.execute(query))
    return sorted(names)[:limit]


def dead_letter_bytes_after(binding: SqlBinding, queue_name: str, cursor: Any, count: int) -> tuple[list[bytes], Any]:
    """The next ``count`` dead letters' bytes after ``cursor``, a ``(table index, row id)`` pair: rows after
    that id by the ``(queue, id)`` index, table after table, so each chunk costs the same at any depth (an
    ``OFFSET`` would walk every row before it) and a row removed meanwhile moves nothing."""
    index, after = cursor if cursor is not None else (0, None)
    tables = binding._readable()
    out: list[bytes] = []
    while index < len(tables) and len(out) < count:
        t = tables[index]
        query = sa.select(t.c.id, *_columns(t)).where(t.c.queue == queue_name)
        if after is not None:
            query = query.where(t.c.id > after)
        query = query.order_by(t.c.id).limit(count - len(out))
        with binding._guard("browse dead letters", queue_name), binding._read() as conn:
            rows = conn.execute(query).all()
        out += [reader_body(bytes(row.payload), row) for row in rows]
        if len(out) < count:
            index, after = index + 1, None  # this table is read to its end
        elif rows:
            after = rows[-1][0]
    return out, (index, after)


def dead_letters_failed_since(binding: SqlBinding, queue_name: str, since_ms: int, *,
                              max_scan: int = 20_000) -> tuple[int, bool]:
    """A COUNT of the queue's dead letters whose ``failed_at`` column is at or after ``since_ms``, summed over
    the dead-letter tables: always whole."""
    total = 0
    for t in binding._readable():
        query = sa.select(sa.func.count()).select_from(t).where(t.c.queue == queue_name,
                                                                t.c.failed_at >= since_ms)
        with binding._guard("count dead letters", queue_name), binding._read() as conn:
            total += int(conn.execute(query).scalar_one())
    return total, True


def browse_dead_letter_bytes(binding: SqlBinding, queue_name: str, start: int, stop: int) -> list[bytes]:
    """The stored bytes of the queue's dead letters ``start``..``stop`` - 1, reserved or not, oldest first, table
    after table (a table's rows are counted only when a read starts past its end); nothing is changed.

    Not :meth:`browse_dead_letter_raws`: a drain must keep what the columns say beside the bytes (the reason
    and error of a body that could not be annotated), so it browses messages here."""
    out: list[bytes] = []
    tables = binding._readable()
    for index, t in enumerate(tables):
        if stop <= start or stop <= 0:
            break
        where = t.c.queue == queue_name
        query = (sa.select(*_columns(t)).where(where).order_by(t.c.id).offset(max(start, 0))
                 .limit(stop - max(start, 0)))
        with binding._guard("browse dead letters", queue_name), binding._read() as conn:
            rows = [reader_body(bytes(row.payload), row) for row in conn.execute(query)]
        out += rows
        if len(rows) == stop - max(start, 0) or index == len(tables) - 1:
            break  # the range is filled, or no table follows: no need to know this table's size
        if rows:  # a short read ends the table: its size is where the rows ended
            count = max(start, 0) + len(rows)
        else:
            with binding._guard("count dead letters", queue_name), binding._read() as conn:
                count = int(conn.execute(sa.select(sa.func.count()).select_from(t).where(where)).scalar_one())
        start, stop = start - count, stop - count
    return out


def discard_dead_letters(binding: SqlBinding, queue_name: str, bodies: Sequence[bytes]) -> int:
    """Delete the oldest rows that read as the bodies (:func:`reader_body`: the bytes a console was given),
    table after table (the first that held each), in transactions of up to ``DISCARD_BATCH`` bodies: one look-up
    of the rows by payload and one delete by id each, so a large discard reads the table once per batch, not
    once per body. A poison wrapper is looked up by the bytes it wraps too: a row stored bare reads as one."""
    removed = 0
    for offset in range(0, len(bodies), DISCARD_BATCH):
        wanted = Counter(bytes(body) for body in bodies[offset:offset + DISCARD_BATCH])
        for t in binding._readable():
            if not wanted:
                break
            stored = set(wanted) | {wrapper.raw for body in wanted if (wrapper := poison_wrapper(body)) is not None}
            found = (sa.select(t.c.id, *_columns(t))
                     .where(t.c.queue == queue_name, t.c.payload.in_(list(stored))).order_by(t.c.id))
            with binding._guard("remove dead letters", queue_name), binding._write() as conn:
                ids = []
                for row in conn.execute(found):
                    read = reader_body(bytes(row.payload), row)
                    if wanted.get(read, 0) > 0:
                        wanted[read] -= 1
                        ids.append(row.id)
                if ids:
                    removed += conn.execute(sa.delete(t).where(t.c.id.in_(ids))).rowcount
            wanted = +wanted  # drop the bodies found here
    return removed
