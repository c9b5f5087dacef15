"""Generate N realistic dead letters as drain records (JSON Lines, docs/drain-records.md) for the Spark benchmark.

Mix (by message): ~80% ``failed`` (a dozen exception types, errors with ids/numbers/quoted values so that
fingerprints group), ~8% ``unknown_urn``, ~4% ``unsupported_schema_version``, ~3% poison (invalid JSON and
non-UTF-8 bodies, the latter base64), across 12 queues, 5 producer languages and 4 brokers, failed over 48 h;
~5% of the records are re-drained duplicates (same meta.id, later drained_at). Deterministic for a seed.

Run: ``.venv/bin/python benchmarks/generate_dead_letters.py --n 1000000 --output /tmp/dl [--files 8]``.
"""

from __future__ import annotations

import argparse
import base64
import random
import sys
from pathlib import Path

import orjson

from airflow_provider_babelqueue import envelope as bq

QUEUES = ["orders", "payments", "emails", "invoices", "shipping", "search-index", "notifications", "billing",
          "inventory", "refunds", "webhooks", "reports"]
LANGS = ["php", "python", "node", "go", "java"]
BROKERS = [("redis", "{q}:failed"), ("rabbitmq", "{q}.failed"), ("sqs", "{q}-dlq"), ("sql", "{q}_failed")]
ERRORS = [
    ("App\\Exceptions\\GatewayTimeout", "timeout after {a}s for order {b}"),
    ("app.errors.CardDeclined", "card '{w}' declined for customer {h}"),
    ("SmtpError", "connection to 10.0.{a}.{b}:25 refused (id {u})"),
    ("java.sql.SQLTransientConnectionException", "HikariPool-1 - Connection is not available, request timed out "
                                                 "after {c}ms"),
    ("KeyError", "'{w}'"),
    ("ValueError", "invalid literal for int() with base 10: '{w}'"),
    ("TypeError", "Cannot read properties of undefined (reading '{w}')"),
    ("redis.exceptions.ConnectionError", "Error 111 connecting to 10.1.{a}.{b}:6379. Connection refused."),
    ("Illuminate\\Database\\QueryException", "SQLSTATE[40001]: Serialization failure: 1213 Deadlock found (order "
                                             "{b})"),
    ("net/http.ErrHandlerTimeout", "http: Handler timeout after {c}ms on /v1/items/{b}"),
    ("RateLimitExceeded", "429 Too Many Requests from api.partner.example, retry after {a}s"),
    ("InventoryMismatch", "sku {h} stock {a} != expected {b}"),
]
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "visa-4242", "mc-5555", "amex-0005"]
START = 1_749_132_000_000
SPAN = 48 * 3_600_000


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:32]}"


def _body(rng: random.Random, index: int) -> tuple[bytes, str, str]:
    """(body, queue_name, meta_id)"""
    queue = QUEUES[min(int(rng.paretovariate(1.2)) - 1, len(QUEUES) - 1)]
    roll = rng.random()
    if roll < 0.03:
        if rng.random() < 0.5:
            return b"{\"job\":\"urn:babel:" + queue.encode() + b":broken\",\"data\":", queue, ""
        return b"\xff\xfe" + rng.randbytes(24), queue, ""
    created = START + rng.randrange(SPAN)
    lang = LANGS[index % 7 % 5]
    urn = f"urn:babel:{queue}:{rng.choice(['created', 'updated', 'deleted', 'sync'])}"
    meta_id = _uuid(rng)
    env = {"job": urn, "trace_id": _uuid(rng), "data": {"id": index, "amount": round(rng.random() * 500, 2),
                                                        "note": rng.choice(WORDS)},
           "meta": {"id": meta_id, "queue": queue, "lang": lang, "schema_version": 1, "created_at": created},
           "attempts": 0}
    if roll < 0.07:
        env["meta"]["schema_version"] = 2
        reason, exception, error = "unsupported_schema_version", None, "schema_version 2 is not supported"
    elif roll < 0.15:
        reason, exception, error = "unknown_urn", None, f"no handler for {urn}"
    else:
        exception, template = ERRORS[min(int(rng.expovariate(0.35)), len(ERRORS) - 1)]
        error = template.format(a=rng.randrange(1, 255), b=rng.randrange(1, 100_000), c=rng.randrange(100, 60_000),
                                w=rng.choice(WORDS), h=f"{rng.getrandbits(40):010x}", u=_uuid(rng))
        reason = "failed"
    attempts = rng.randrange(1, 8) if reason == "failed" else 1
    failed_at = created + int(rng.expovariate(1 / 120_000))
    annotated = bq.annotate_dead_letter(env, reason, original_queue=queue, attempts=attempts, error=error,
                                        exception=exception, failed_at=failed_at)
    annotated["attempts"] = attempts
    return bq.encode(annotated), queue, meta_id


def record(rng: random.Random, body: bytes, queue: str, meta_id: str, drained_at: int) -> bytes:
    """One drain record, same keys and order as ``airflow_provider_babelqueue.core.records.drain_record``."""
    try:
        text, encoding = body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(body).decode("ascii"), "base64"
    broker, dlq = BROKERS[QUEUES.index(queue) % len(BROKERS)]
    return orjson.dumps({
        "v": 1, "body": text, "body_encoding": encoding, "broker": broker, "queue_name": queue,
        "dead_letter_queue": dlq.format(q=queue), "source_conn_id": f"{broker}_default", "meta_id": meta_id,
        "delivery_count": rng.randrange(1, 8) if broker in ("sqs", "rabbitmq") else None, "native_reason": None,
        "headers": {}, "drained_at": drained_at,
    }, option=orjson.OPT_APPEND_NEWLINE)


def generate(n: int, output: Path, files: int = 8, seed: int = 7) -> list[Path]:
    """Write ``n`` drain records into ``files`` JSONL files under ``output``; returns the paths."""
    rng = random.Random(seed)
    output.mkdir(parents=True, exist_ok=True)
    paths = [output / f"dlq-bench-{i:03d}.jsonl" for i in range(files)]
    handles = [path.open("wb", buffering=1 << 20) for path in paths]
    recent: list[tuple[bytes, str, str]] = []
    drained = START + SPAN
    try:
        for index in range(n):
            if recent and rng.random() < 0.05:
                body, queue, meta_id = rng.choice(recent)  # re-drained after a crash
            else:
                body, queue, meta_id = _body(rng, index)
                if len(recent) < 10_000:
                    recent.append((body, queue, meta_id))
                else:
                    recent[rng.randrange(10_000)] = (body, queue, meta_id)
            handles[index % files].write(record(rng, body, queue, meta_id, drained + index))
    finally:
        for handle in handles:
            handle.close()
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    paths = generate(args.n, args.output, args.files, args.seed)
    size = sum(path.stat().st_size for path in paths)
    print(f"wrote {args.n:,} drain records, {size / 1e6:.0f} MB, in {len(paths)} files under {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
