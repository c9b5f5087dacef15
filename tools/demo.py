"""``make demo``: real dead letters on the embedded SQLite queue, triaged end to end by the sample DAG.

``python -m tools.demo`` (run by ``.ci/demo.sh`` with ``AIRFLOW_HOME`` and the DAGs folder
set) does three things:

1. **seed**: empties the embedded queue (``$AIRFLOW_HOME/babelqueue.sqlite``), publishes sample orders and runs a
   consumer whose handlers fail for some of them, so the DLQ fills with real dead letters carrying real reasons:
   handler failures (two exception types), an unknown URN, poison bodies and an unsupported schema version;
2. **triage**: runs ``babelqueue_dlq_triage_report`` with ``airflow dags test`` (Spark in local mode), writing
   under ``--output-root``;
3. **summary**: prints where the HTML report, the Parquet and the replay set are, and a table by reason.

Re-running starts again from an empty queue and an empty output folder.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow_provider_babelqueue.core import envelope as bq

__all__ = ["DAG_ID", "QUEUE", "expected_reasons", "failing_orders", "main", "sample_messages", "seed", "summarize"]

DAG_ID = "babelqueue_dlq_triage_report"
QUEUE = "orders"
CREATED = "urn:babel:orders:created"
REFUNDED = "urn:babel:orders:refunded"  # no handler in the demo consumer: dead-lettered as unknown_urn
ORDERS = 40


class CardDeclinedError(Exception):
    """The demo payment gateway refuses orders over 1200."""


def _order(n: int) -> dict[str, Any]:
    return {"order_id": f"A-{1000 + n}", "customer": f"c-{n % 7}", "total": round(35.5 * n, 2), "currency": "EUR"}


def sample_messages(queue_name: str = QUEUE) -> list[bytes]:
    """The demo's bodies, in publish order: orders, two refunds, two poison bodies, one schema_version 2."""
    bodies = [bq.encode(bq.make_envelope(CREATED, _order(n), queue_name=queue_name))
              for n in range(1, ORDERS + 1)]
    bodies += [bq.encode(bq.make_envelope(REFUNDED, {"order_id": f"A-{1000 + n}"}, queue_name=queue_name))
               for n in (3, 4)]
    bodies += [b'{"job":"urn:babel:orders:created","data":{"order_id":"A-2001"', b"\x00\xffnot json at all"]
    future = bq.make_envelope(CREATED, _order(99), queue_name=queue_name)
    future["meta"].update(lang="php", schema_version=2)  # a producer on a newer SDK: quarantined, never guessed at
    bodies.append(bq.encode(future))
    return bodies


def _handle_created(envelope: dict[str, Any]) -> None:
    order = envelope["data"]
    if order["total"] > 1200:
        raise CardDeclinedError(f"card declined for {order['order_id']} ({order['total']} {order['currency']})")
    if int(order["order_id"][2:]) % 9 == 0:
        raise TimeoutError(f"payment gateway timed out for {order['order_id']}")


def failing_orders() -> list[str]:
    """The ``order_id`` values the demo handler fails on (declined or timed out), in order."""
    return [_order(n)["order_id"] for n in range(1, ORDERS + 1)
            if _order(n)["total"] > 1200 or (1000 + n) % 9 == 0]


def expected_reasons() -> dict[str, int]:
    """What the seeded DLQ holds, by reason, derived from the rules above (the demo test checks it)."""
    return {"failed": len(failing_orders()), "poison": 2, "unknown_urn": 2, "unsupported_schema_version": 1}


def seed(binding: Any, queue_name: str = QUEUE, *, log: Any = print) -> dict[str, Any]:
    """Publish the sample messages and consume them once; returns the consumer's summary.

    :param binding: an empty queue binding (the demo passes the embedded SQLite one).
    :param queue_name: the logical queue (tests give each run its own).
    """
    from airflow_provider_babelqueue.engine.consume import Backoff, Consumer

    bodies = sample_messages(queue_name)
    binding.publish_batch(bodies, queue_name)
    log(f"published {len(bodies)} messages to {queue_name!r}")
    consumer = Consumer(binding, queue_name, {CREATED: _handle_created}, max_attempts=2,
                        backoff=Backoff(kind="fixed", base=0.0, jitter=False))
    summary = consumer.run(reserve_timeout=0.5).as_dict()
    log(f"consumed: {json.dumps(summary, sort_keys=True)}")
    log(f"dead letters waiting in {binding.dead_letter_name(queue_name)!r}: {binding.dead_letter_depth(queue_name)}")
    return summary


def _run_folder(output_root: Path) -> Path:
    # every run has a folder; "_pending" holds drain files waiting for a triage, not a run
    runs = sorted((path for path in (output_root / DAG_ID).glob("*/") if not path.name.startswith("_")),
                  key=lambda path: path.stat().st_mtime)
    if not runs:
        raise SystemExit(f"no run folder under {output_root / DAG_ID}: did the DAG run?")
    return runs[-1]


def summarize(output_root: Path, *, log: Any = print) -> dict[str, Any]:
    """Print where the run's outputs are and a table by reason; returns the triage and replay summaries."""
    from airflow_provider_babelqueue.workspace import summary_table

    run = _run_folder(output_root)
    triage = json.loads((run / "triage" / "_triage_summary.json").read_text())
    replay = json.loads((run / "replay_set" / "_replay_summary.json").read_text())
    drained = sorted((run / "drain").glob("*.jsonl"))
    log("")
    log("BabelQueue demo: dead-letter triage on the embedded SQLite queue")
    log(f"  drain file (JSON Lines)  {drained[0] if drained else '(none)'}")
    log(f"  triage Parquet           {run / 'triage'}  (partitioned by reason)")
    log(f"  HTML report              {run / 'report' / 'report.html'}")
    log(f"  replay set               {run / 'replay_set'}")
    log("")
    log(summary_table(triage["by_reason"], ("dead-letter reason", "messages"), total=True))
    log("")
    targets = ", ".join(f"{queue}: {count}" for queue, count in replay["targets"].items()) or "nothing"
    log(f"replay set (reasons {replay['policy'].get('reasons')}): {replay['lines']} message(s) → {targets}; "
        "not republished (dry_run is on by default).")
    env = " ".join(f"{name}={shlex.quote(os.environ[name])}" for name in ("AIRFLOW_HOME", "AIRFLOW__CORE__DAGS_FOLDER")
                   if os.environ.get(name))
    airflow = shlex.quote(str(Path(sys.executable).parent / "airflow"))
    # one folder for every queue: the replay sends each dead letter back to its own original queue
    conf = json.dumps({"replay_set": replay["path"], "queue_name": "", "dry_run": False})
    log(f"to replay them:\n  {env} {airflow} dags test babelqueue_dlq_replay -c {shlex.quote(conf)}")
    return {"triage": triage, "replay": replay, "run": str(run)}


def _airflow_dags_test(output_root: Path, log_file: Path, *, log: Any = print) -> None:
    airflow = str(Path(sys.executable).parent / "airflow")
    conf = json.dumps({"output_root": str(output_root)})
    log(f"running {DAG_ID} with `airflow dags test` (Spark local mode; log: {log_file}) ...")
    started = time.monotonic()
    with log_file.open("wb") as out:
        done = subprocess.run([airflow, "dags", "test", DAG_ID, "-c", conf], stdout=out, stderr=subprocess.STDOUT,
                              check=False)
    text = log_file.read_text(errors="replace")
    failed = [line for line in text.splitlines() if "Marking task as FAILED" in line or "state=failed" in line]
    if done.returncode != 0 or failed:
        sys.stderr.write(text[-6000:])
        raise SystemExit(f"`airflow dags test {DAG_ID}` failed (exit {done.returncode}); full log: {log_file}")
    log(f"... done in {time.monotonic() - started:.0f} s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-root", type=Path, required=True, help="where the DAG run writes its files")
    parser.add_argument("--skip-dag", action="store_true", help="only seed the queue")
    args = parser.parse_args(argv)
    from airflow_provider_babelqueue.hooks import DEFAULT_CONN_ID, default_sqlite_path, get_hook

    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    logging.getLogger("airflow_provider_babelqueue.consumer").setLevel(logging.ERROR)  # one line per dead letter
    database = default_sqlite_path()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{database}{suffix}").unlink(missing_ok=True)
    shutil.rmtree(args.output_root, ignore_errors=True)
    args.output_root.mkdir(parents=True)
    hook = get_hook(DEFAULT_CONN_ID)
    try:
        seed(hook.get_binding())
    finally:
        hook.close()
    if args.skip_dag:
        return 0
    _airflow_dags_test(args.output_root.resolve(), args.output_root.parent / "dags-test.log")
    summarize(args.output_root.resolve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
