"""The pure parts of PostgreSQL's one-round-trip batch (``bindings.sql.postgres``): array literals and the
settlement's statements. The query itself runs against the real PostgreSQL in test_sql_binding.py."""

from __future__ import annotations

import sqlalchemy as sa

from airflow_provider_babelqueue.bindings.sql.postgres import pg_array, sends_ahead, settle_statements


def test_an_array_literal_reads_back_every_float_exactly() -> None:
    values = [0.1, 1 / 3, 1764966000.123456, 2.0**-1074, 12345678901234567]
    literal = pg_array(values)
    assert literal.startswith("{") and literal.endswith("}")
    assert [float(text) for text in literal[1:-1].split(",")] == [float(v) for v in values]
    assert pg_array([]) == "{}"


def test_only_psycopg2_sends_statements_ahead() -> None:
    assert sends_ahead(sa.create_engine("postgresql+psycopg2://u@h/db").dialect)
    assert not sends_ahead(sa.create_engine("postgresql+psycopg://u@h/db").dialect)
    assert not sends_ahead(sa.create_engine("sqlite://").dialect)


def test_the_settlement_gates_every_statement_on_the_token() -> None:
    sql, values = settle_statements('"jobs"', 17.5, [3, 4], [(9, b'{"attempts":1}', 20.25)])
    assert sql.count("%(bq_old)s") == 2 and sql.index("UPDATE") < sql.index("DELETE")
    assert values == {"bq_old": 17.5, "bq_rids": "{9}", "bq_payloads": [b'{"attempts":1}'], "bq_due": "{20.25}",
                      "bq_ids": "{3,4}"}
    acks_only, ack_values = settle_statements('"jobs"', 1.0, [5], [])
    assert "UPDATE" not in acks_only and ack_values == {"bq_old": 1.0, "bq_ids": "{5}"}
