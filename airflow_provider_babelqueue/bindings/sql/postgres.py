"""PostgreSQL's one-round-trip batch: a consumer's settlement and its next reserve sent as one query.

On psycopg2 a query with parameters is put together on the client and sent as one simple query, which may hold
several statements; the server runs them as one implicit transaction (all of them or, on an error, none) and the
driver returns the last one's rows. A consumer's end of batch (the acks' ``DELETE``, the releases' ``UPDATE``, the
planner settings, the next ``UPDATE … RETURNING``) then costs one round trip instead of the four of an explicit
transaction. psycopg 3 binds parameters on the server, where a query with parameters holds one statement: there
each statement goes on its own (:func:`sends_ahead`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

__all__ = ["ORDERED_SCAN", "pg_array", "run_at_once", "sends_ahead", "settle_statements"]

#: For the reserve's transaction only: read the rows in the queue index's order. A queue table's statistics lag its
#: churn (a burst lands in a table analysed when it was empty), and with a few estimated rows the planner prefers a
#: bitmap scan and a sort of every ready row, payloads included, to take the first ``limit``: 20 ms a batch at
#: 14,000 ready rows, against 0.3 ms for the index scan the reserve's ORDER BY is built for.
ORDERED_SCAN = "SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off"


def pg_array(values: Iterable[int | float]) -> str:
    """A PostgreSQL array literal (``{1,2,3}``) of numbers, for a ``%(name)s::bigint[]`` parameter: psycopg2
    adapts a Python list element by element (about 1.5 µs per number, 0.2 ms per batch of 100 ids), a string in
    one step. ``repr`` of a float is the shortest text that reads back as the same double."""
    return "{" + ",".join(map(repr, values)) + "}"


def sends_ahead(dialect: sa.Dialect) -> bool:
    """Whether statements can travel ahead of a statement with parameters in one query: PostgreSQL on psycopg2
    (see the module docstring)."""
    return dialect.name == "postgresql" and dialect.driver == "psycopg2"


def settle_statements(table: str, token: float, acked: Sequence[int],
                      released: Sequence[tuple[int, bytes, float]]) -> tuple[str, dict[str, Any]]:
    """The settlement of ready-table reservations sharing one ``token``, as statements to send ahead of the next
    reserve: the releases as one ``UPDATE`` from arrays (each row its new body, ``attempts`` + 1 and its due time),
    the acks as one ``DELETE``; both gated on the token, so a row reclaimed since is left to its new holder.

    :param table: the ready table's quoted name.
    :param acked: row ids to delete.
    :param released: ``(row id, bumped body, due time)`` of each row to release.
    :returns: ``(sql, named parameters)``; the parameters' names start with ``bq_``, as the reserve's do.
    """
    sql = ""
    values: dict[str, Any] = {"bq_old": token}
    if released:
        sql += (f"UPDATE {table} SET payload = v.payload, attempts = {table}.attempts + 1, reserved_at = NULL, "
                f"available_at = v.available_at FROM (SELECT unnest(%(bq_rids)s::bigint[]) AS id, "
                f"unnest(%(bq_payloads)s::bytea[]) AS payload, unnest(%(bq_due)s::float8[]) AS available_at) "
                f"AS v WHERE {table}.id = v.id AND {table}.reserved_at = %(bq_old)s; ")
        values.update(bq_rids=pg_array([row_id for row_id, _, _ in released]),
                      bq_payloads=[body for _, body, _ in released],
                      bq_due=pg_array([due for _, _, due in released]))
    if acked:
        sql += f"DELETE FROM {table} WHERE reserved_at = %(bq_old)s AND id = ANY(%(bq_ids)s::bigint[]); "
        values["bq_ids"] = pg_array(acked)
    return sql, values


def run_at_once(engine: Engine, sql: str, params: dict[str, Any]) -> list[Any]:
    """Run ``sql`` (several statements) as one simple query on the driver's own cursor and return the last
    statement's rows, as the driver's tuples: no SQLAlchemy execution path, once per batch.

    The connection is in autocommit for the call (the query is its own transaction), then back. A call that fails
    in any way drops its connection from the pool: its state is then unknown, and a connection left in autocommit
    would run SQLAlchemy's later transactions a statement at a time. A driver error is raised as SQLAlchemy's
    (``DBAPIError``), so the binding words it as it does its other statements' errors.
    """
    with engine.connect() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None  # a connection just checked out has its driver's
        try:
            driver.autocommit = True
            with driver.cursor() as cursor:
                cursor.execute(sql, params)
                rows: list[Any] = cursor.fetchall()
            driver.autocommit = False
        except BaseException as exc:
            conn.invalidate()
            errors = engine.dialect.loaded_dbapi.Error
            if isinstance(exc, errors):
                raise sa.exc.DBAPIError.instance(sql, params, exc, errors) from exc
            raise
    return rows
