"""Spark dead-letter triage + report, end to end, at several sizes on local[2]: wall time and peak RSS.

For each size N: generate N drain records (``generate_dead_letters.py``, cached under ``--work``), then run
``spark-submit triage.py`` and ``spark-submit report.py`` exactly as a user would. Wall time includes both
JVM start-ups. Peak RSS is the largest sum of RSS over the whole spark-submit process tree (launcher, JVM,
Python driver, Python workers), sampled every 50 ms with psutil.

Goals: 1M records ≤ 30 s wall and ≤ 2 GB peak RSS; 3M ≤ 3.3× the 1M time.

Run: ``.venv/bin/python benchmarks/bench_spark.py [--sizes 100000,1000000,3000000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate_dead_letters import generate  # noqa: E402

from airflow_provider_babelqueue.spark import job_path  # noqa: E402

CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.files.maxPartitionBytes": str(64 << 20),
    "spark.driver.memory": "1g",
    "spark.sql.adaptive.enabled": "true",
}


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for proc in [process, *process.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run(job: str, args: list[str]) -> tuple[float, int, dict]:
    """Run one job; returns (wall seconds, peak tree RSS bytes, its summary line)."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    command = [shutil.which("spark-submit", path=env["PATH"]) or "spark-submit", "--master", "local[2]"]
    for key, value in CONF.items():
        command += ["--conf", f"{key}={value}"]
    started = time.perf_counter()
    proc = subprocess.Popen([*command, job_path(job), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    watched, peak, stop = psutil.Process(proc.pid), 0, threading.Event()

    def poll() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, tree_rss(watched))
            stop.wait(0.05)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    out, _ = proc.communicate()
    stop.set()
    thread.join()
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{job} failed with {proc.returncode}")
    line = next(line for line in out.splitlines() if line.startswith('{"job":'))
    return elapsed, peak, json.loads(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="comma-separated record counts")
    parser.add_argument("--work", type=Path, default=Path("/tmp/babelqueue-bench-spark"))
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    rows = []
    for n in sizes:
        data = args.work / f"in-{n}"
        if not (data / ".complete").exists():
            shutil.rmtree(data, ignore_errors=True)
            generate(n, data, files=8)
            (data / ".complete").touch()
        mb = sum(p.stat().st_size for p in data.glob("*.jsonl")) / 1e6
        triage_dir, report_dir = args.work / f"triage-{n}", args.work / f"report-{n}"
        # end to end in one application (triage --report-output), as the operator runs it with report_output
        t_triage, rss_triage, summary = run("triage", ["--input", str(data), "--output", str(triage_dir),
                                                       "--report-output", str(report_dir)])
        # the standalone report job on the same Parquet, for comparison
        t_report, rss_report, _ = run("report", ["--input", str(triage_dir), "--output", str(report_dir)])
        rows.append((n, mb, t_triage, t_report, rss_triage, rss_report, summary["rows"]))
        print(f"  {n:>9,}: triage+report {t_triage:5.1f} s, report alone {t_report:5.1f} s, "
              f"peak {rss_triage / 2**30:.2f} / {rss_report / 2**30:.2f} GiB, "
              f"{summary['rows']:,} rows ({summary['duplicates_removed']:,} duplicates)", flush=True)
    print("\n| records | input MB | triage + report (one app) s | peak RSS GiB | report alone s | its peak GiB "
          "| rows out | time vs previous |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    previous = None
    for n, mb, t1, t2, rss1, rss2, out_rows in rows:
        ratio = f"{t1 / previous[1]:.2f}× for {n / previous[0]:.0f}× data" if previous else "—"
        print(f"| {n:,} | {mb:.0f} | {t1:.1f} | {rss1 / 2**30:.2f} | {t2:.1f} | {rss2 / 2**30:.2f} | {out_rows:,} "
              f"| {ratio} |")
        previous = (n, t1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
