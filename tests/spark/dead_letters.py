"""A known set of drain records for the Spark job tests, written with the drain's own record writer.

Every expected answer the tests assert is derived by hand from the table below (see each test).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_provider_babelqueue.bindings.message import ReceivedMessage
from airflow_provider_babelqueue.core import envelope as bq
from airflow_provider_babelqueue.core.records import drain_record

CREATED = 1_749_132_000_000  # 2025-06-05 14:00:00 UTC
DRAINED = 1_749_139_200_000  # 2 hours later
GATEWAY = "App\\Exceptions\\GatewayTimeout"
DECLINED = "app.errors.CardDeclined"
SMTP = "SmtpError"


@dataclass(frozen=True)
class Letter:
    """One dead letter: its body and where it was drained from."""

    name: str
    body: bytes
    queue_name: str
    broker: str
    dead_letter_queue: str


def _envelope(index: int, urn: str, queue: str, lang: str, *, schema_version: int = 1, alias: bool = False,
              data: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    env: dict[str, Any] = {
        "urn" if alias else "job": urn,
        "trace_id": f"00000000-0000-4000-8000-{index:012d}",
        "data": data if data is not None else {"n": index},
        "meta": {"id": f"11111111-0000-4000-8000-{index:012d}", "queue": queue, "lang": lang,
                 "schema_version": schema_version, "created_at": CREATED + index * 60_000},
        "attempts": 0,
    }
    env.update(extra or {})
    return env


def _dead(env: dict[str, Any], reason: str, error: str | None, exception: str | None, attempts: int,
          failed_after_s: int, original_queue: str | None = None) -> bytes:
    annotated = bq.annotate_dead_letter(
        env, reason, original_queue=original_queue or env["meta"]["queue"], attempts=attempts, error=error,
        exception=exception, failed_at=env["meta"]["created_at"] + failed_after_s * 1000)
    annotated["attempts"] = attempts
    return bq.encode(annotated)


F6_BODY = (
    b'{"job":"urn:babel:payments:capture","trace_id":"00000000-0000-4000-8000-000000000006","data":[],'
    b'"meta":{"id":"11111111-0000-4000-8000-000000000006","queue":"payments","lang":"php","schema_version":1,'
    b'"created_at":1749132360000},"attempts":1,"x-php":{"url":"https:\\/\\/shop.example\\/cart","total":2.50},'
    b'"dead_letter":{"reason":"failed","error":"card declined: insufficient funds",'
    b'"exception":"app.errors.CardDeclined","failed_at":1749132600000,"original_queue":"payments","attempts":1,'
    b'"lang":"php"}}'
)


def letters() -> list[Letter]:
    """15 distinct dead letters: 8 failed, 2 unknown_urn, 2 unsupported_schema_version, 3 poison."""
    o, p, e = ("orders", "redis", "orders:failed"), ("payments", "rabbitmq", "payments.failed"), \
        ("emails", "sql", "emails_failed")
    urn_o, urn_p, urn_e = "urn:babel:orders:created", "urn:babel:payments:capture", "urn:babel:emails:send"
    uuid_a, uuid_b = "123e4567-e89b-42d3-a456-426614174000", "9b2e7c1a-0f3d-4e5b-8a6c-1d2e3f4a5b6c"
    rows = [
        # name, (queue, broker, dlq), body
        ("F1", o, _dead(_envelope(1, urn_o, "orders", "php"), "failed", "timeout after 30s for order 1042",
                        GATEWAY, 3, 30)),
        ("F2", o, _dead(_envelope(2, urn_o, "orders", "php"), "failed", "timeout after 45s for order 77",
                        GATEWAY, 5, 45)),
        # failed on a priority queue: its target is dead_letter.original_queue, not meta.queue
        ("F3", o, _dead(_envelope(3, urn_o, "orders", "php"), "failed", "timeout after 5s for order 9",
                        GATEWAY, 3, 5, original_queue="orders-priority")),
        # unknown keys, a float written as 2.50, non-ASCII and "/" in the data: replay keeps them
        ("F4", p, _dead(_envelope(4, urn_p, "payments", "python", data={"amount": 2.5, "note": "café/ü"},
                                  extra={"tenant": "acme"}),
                        "failed", "card 'visa-4242' declined for customer 3f2a9c1e77", DECLINED, 3, 120)),
        ("F5", p, _dead(_envelope(5, urn_p, "payments", "python"), "failed",
                        "card 'mc-5555' declined for customer 0a1b2c3d4e", DECLINED, 3, 180)),
        # written by another SDK (PHP): "data":[], escaped slashes, 2.50 — decoded and re-encoded on reset
        ("F6", p, F6_BODY),
        ("F7", e, _dead(_envelope(7, urn_e, "emails", "node"), "failed",
                        f"connection to 10.0.0.12:25 refused (id {uuid_a})", SMTP, 2, 3600)),
        ("F8", e, _dead(_envelope(8, urn_e, "emails", "node"), "failed",
                        f"connection to 192.168.1.1:587 refused (id {uuid_b})", SMTP, 10, 7200)),
        # the urn alias instead of job
        ("U1", o, _dead(_envelope(9, "urn:babel:orders:archived", "orders", "php", alias=True), "unknown_urn",
                        "no handler for urn:babel:orders:archived", None, 1, 1)),
        ("U2", o, _dead(_envelope(10, "urn:babel:orders:archived", "orders", "php", alias=True), "unknown_urn",
                        "no handler for urn:babel:orders:archived", None, 1, 2)),
        ("S1", p, _dead(_envelope(11, urn_p, "payments", "go", schema_version=2), "unsupported_schema_version",
                        "schema_version 2 is not supported", None, 0, 0)),
        ("S2", p, _dead(_envelope(12, urn_p, "payments", "go", schema_version=3), "unsupported_schema_version",
                        "schema_version 3 is not supported", None, 0, 0)),
        ("P1", o, b"{not json"),
        ("P2", p, b"\xff\xfe\x00garbage\x80"),
        ("P3", e, b"<html>oops</html>"),
    ]
    return [Letter(name, body, q, broker, dlq) for name, (q, broker, dlq), body in rows]


def by_name() -> dict[str, Letter]:
    return {letter.name: letter for letter in letters()}


def record(letter: Letter, drained_at: int) -> bytes:
    try:
        envelope, error = bq.decode(letter.body), None
    except Exception as exc:  # noqa: BLE001 - poison
        envelope, error = None, str(exc)
    message = ReceivedMessage(body=letter.body, queue_name=letter.queue_name, envelope=envelope,
                              decode_error=error, attempts=0, delivery_count=None, headers={})
    return drain_record(message, broker=letter.broker, dead_letter_queue=letter.dead_letter_queue,
                        source_conn_id=f"{letter.broker}_default", drained_at=drained_at)


#: Drained twice (a crash before the ack): name → drained_at of the LATER copy (in the second file).
DUPLICATES = {"F1": DRAINED + 3_000_000, "U1": DRAINED + 3_000_000, "S1": DRAINED + 3_000_000,
              "P1": DRAINED + 3_000_000}


def write_drain_files(folder: Path) -> list[Path]:
    """Two drain files (the second a later drain that saw 4 messages again) plus a torn last line."""
    folder.mkdir(parents=True, exist_ok=True)
    all_letters = letters()
    first = b"".join(record(letter, DRAINED + i * 1000) for i, letter in enumerate(all_letters))
    named = by_name()
    second = b"".join(record(named[name], at) for name, at in DUPLICATES.items())
    second += b'{"v":1,"body":"{\\"job\\":\\"urn:torn'  # a crash mid-write: no closing brace, no newline
    paths = [folder / "dlq-run1-000000000001.jsonl", folder / "dlq-run2-000000000002.jsonl"]
    paths[0].write_bytes(first)
    paths[1].write_bytes(second)
    return paths


def drained_at_of(name: str) -> int:
    """The earliest drained_at of a letter (what triage keeps)."""
    index = [letter.name for letter in letters()].index(name)
    return DRAINED + index * 1000


def expected_reset(body: bytes) -> bytes:
    """What the replay set must hold for a body: the replay engine's own reset of the original bytes."""
    return bq.encode(bq.reset_for_replay(bq.decode(body, exact=True)))


if __name__ == "__main__":  # pragma: no cover
    import sys

    for path in write_drain_files(Path(sys.argv[1])):
        print(path)
