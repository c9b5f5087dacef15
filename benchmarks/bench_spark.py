"""Spark dead-letter triage + report, end to end, at several sizes on local[2]: wall time and peak RSS.

For each size N: generate N drain records (``generate_dead_letters.py``, cached under ``--work``), then run
``spark-submit triage.py`` and ``spark-submit report.py`` exactly as a user would, and the baseline:
``spark_copy.py``, Spark reading the same records with triage's reader and writing them back as Parquet (same
settings). The ratio to it says what the triage adds to Spark's own floor on this machine, which
compares across machines better than seconds; the machine's CPU seconds during the run (user, system, I/O wait,
steal) are printed too. Every wall time includes that job's JVM start-up. Peak RSS is the largest sum of RSS over
the whole spark-submit process tree (launcher, JVM, Python driver, Python workers), sampled every 50 ms with psutil
(the tree itself is found again every second); a child caught between fork and exec shares the JVM's memory and is
not counted twice.

Goals, as ratios to the copy measured in the same run: 1M ≤ 3.0×, 3M ≤ 3.75×; peak RSS ≤ 2 GiB at every size.

The Spark settings are the jobs' recommended ones for local mode (``recommended_conf("local[2]")``, what the
operator submits); ``--conf KEY=VALUE`` overrides one. ``--class-archive PATH`` adds the optional driver
class-data archive (``spark/class_archive.py``; built there first when missing, its build time printed), as the
operator does with ``class_archive=``; the copy then uses it too. To weigh a setting or the archive, use
``tools/spark_startup_ab.py``, which interleaves the variants run by run.

The machines this runs on change speed from one spell to the next, so ``--repeat N`` runs the triage + report and
the copy N times at each size (interleaved: triage, copy, triage, copy ...); the table gives medians and ranges,
and the closing lines say which goal each median meets.

Run: ``.venv/bin/python benchmarks/bench_spark.py [--sizes 100000,1000000,3000000] [--repeat 3]
[--conf KEY=VALUE ...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate_dead_letters import generate  # noqa: E402
from machine import describe  # noqa: E402

from airflow_provider_babelqueue.spark import job_path, recommended_conf  # noqa: E402
from airflow_provider_babelqueue.spark.class_archive import build_class_archive, with_archive  # noqa: E402

#: Exactly what BabelQueueSparkTriageOperator submits on a local[2] connection (the jobs' recommended settings);
#: ``--conf KEY=VALUE`` overrides one, as the operator's ``conf`` does.
CONF = recommended_conf("local[2]")


def _unexeced_fork(proc: psutil.Process) -> bool:
    """A child the JVM is spawning (Hadoop runs ``chmod`` for every file it creates on a local disk): between
    its fork and its exec it shares the JVM's memory and reports the JVM's whole RSS as its own, so counting it
    would add the JVM a second time. It still runs the parent's executable under the spawning thread's name
    (e.g. ``Executor task l``); real children (the Python driver, ``chmod`` itself) do not."""
    parent = proc.parent()
    return parent is not None and proc.exe() == parent.exe() and proc.name() != parent.name()


def process_tree(process: psutil.Process) -> list[psutil.Process]:
    """The process and its descendants, each address space once (see :func:`_unexeced_fork`)."""
    try:
        tree = [process, *process.children(recursive=True)]
    except psutil.Error:  # the job just ended
        return []
    kept = []
    for proc in tree:
        try:
            if proc is process or not _unexeced_fork(proc):
                kept.append(proc)
        except psutil.Error:  # gone, or exec'ing right now
            pass
    return kept


def tree_rss(tree: list[psutil.Process]) -> int:
    """RSS summed over a process tree (:func:`process_tree`); processes that ended count 0."""
    total = 0
    for proc in tree:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


#: How often the sampler reads the RSS of the known processes, and how often it looks for new ones. Finding
#: the tree scans every process of the machine (~200 files per scan): at every sample that cost the 2-core
#: machine ~4 % of a core, taken from the job it measures. The tree changes only at start-up (launcher,
#: JVM, Python driver) and for short-lived children, so it is found again once a second.
SAMPLE_SECONDS, TREE_SECONDS = 0.05, 1.0


#: The Spark floor the triage is compared with (same input and settings; see its docstring).
COPY_SCRIPT = str(Path(__file__).resolve().with_name("spark_copy.py"))


def cpu_seconds() -> dict[str, float]:
    """Machine-wide CPU seconds so far (``/proc/stat``): user, system, I/O wait and steal (the hypervisor's)."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    return {"user": (fields[0] + fields[1]) / tick, "sys": fields[2] / tick, "iowait": fields[4] / tick,
            "steal": fields[7] / tick}


def run(script: str, args: list[str], conf: dict[str, str] | None = None) -> tuple[float, int, dict]:
    """Run one job script (``job_path(name)`` or :data:`COPY_SCRIPT`; with ``conf``, default :data:`CONF`);
    returns (wall seconds, peak tree RSS bytes, its summary line plus ``"cpu"``: the machine's CPU seconds
    meanwhile)."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    command = [shutil.which("spark-submit", path=env["PATH"]) or "spark-submit", "--master", "local[2]"]
    for key, value in (CONF if conf is None else conf).items():
        command += ["--conf", f"{key}={value}"]
    cpu_before, started = cpu_seconds(), time.perf_counter()
    proc = subprocess.Popen([*command, script, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    watched, peak, stop = psutil.Process(proc.pid), 0, threading.Event()

    def poll() -> None:
        nonlocal peak
        tree, found = [], float("-inf")
        while not stop.is_set():
            if time.monotonic() - found >= TREE_SECONDS:
                tree, found = process_tree(watched), time.monotonic()
            peak = max(peak, tree_rss(tree))
            stop.wait(SAMPLE_SECONDS)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    out, _ = proc.communicate()
    stop.set()
    thread.join()
    elapsed = time.perf_counter() - started
    cpu_after = cpu_seconds()
    if proc.returncode != 0:
        raise SystemExit(f"{script} failed with {proc.returncode}")
    line = next(line for line in out.splitlines() if line.startswith('{"job":'))
    summary = json.loads(line)
    summary["cpu"] = {key: cpu_after[key] - cpu_before[key] for key in cpu_after}
    return elapsed, peak, summary


#: The goals of the triage + report benchmark, as ratios to Spark's own copy of the same input measured in the
#: same run (the shared machine's speed drifts, so seconds measure the machine more than the code), and a
#: peak-memory bound.
GOAL_RATIO_1M, GOAL_RATIO_3M, GOAL_PEAK_BYTES = 3.0, 3.75, 2 * 2**30


def _spread(values: list[float]) -> str:
    """``median (min–max)`` of seconds, or the one value."""
    median = statistics.median(values)
    return f"{median:.1f}" if len(values) == 1 else f"{median:.1f} ({min(values):.1f}–{max(values):.1f})"


def goal_lines(results: dict[int, dict]) -> list[str]:
    """One line per goal the measured sizes can speak to, each saying met or not met and by what numbers.

    :param results: per size, ``{"triage": [seconds...], "peak": bytes}``.
    """
    lines = []
    peak = max(r["peak"] for r in results.values())
    lines.append(f"peak RSS <= 2 GiB at every size: {'met' if peak <= GOAL_PEAK_BYTES else 'NOT met'} "
                 f"({peak / 2**30:.2f} GiB)")
    for size, goal, label in ((1_000_000, GOAL_RATIO_1M, "1M"), (3_000_000, GOAL_RATIO_3M, "3M")):
        if size in results and results[size]["copy"]:
            ratio = statistics.median(results[size]["triage"]) / statistics.median(results[size]["copy"])
            lines.append(f"{label} <= {goal}x Spark's copy: {'met' if ratio <= goal else 'NOT met'} "
                         f"({ratio:.2f}x, medians)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="comma-separated record counts")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of triage + report and of the copy at each size (medians are reported)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/babelqueue-bench-spark"))
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="override one Spark setting (repeatable), e.g. --conf spark.driver.memory=768m")
    parser.add_argument("--class-archive", type=Path, default=None, metavar="PATH",
                        help="map this driver class-data archive (built there first when missing)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be 1 or more")
    print(describe(java=True), flush=True)
    overrides = dict(item.split("=", 1) for item in args.conf)
    plain = recommended_conf("local[2]", overrides)
    CONF.clear()
    CONF.update(plain)
    if args.class_archive is not None:
        if not args.class_archive.exists():
            started = time.perf_counter()
            build_class_archive(args.class_archive, conf=plain)
            print(f"  class archive built in {time.perf_counter() - started:.1f} s: {args.class_archive}", flush=True)
        CONF.update(with_archive(plain, args.class_archive))
    sizes = [int(size) for size in args.sizes.split(",")]
    results: dict[int, dict] = {}
    for n in sizes:
        data = args.work / f"in-{n}"
        if not (data / ".complete").exists():
            shutil.rmtree(data, ignore_errors=True)
            generate(n, data, files=8)
            (data / ".complete").touch()
            # the kernel writes the new files out in the background; the first run should not share the
            # machine with it (that run took 1.6 s longer at 1M, its system time 2 s more)
            os.sync()
        mb = sum(p.stat().st_size for p in data.glob("*.jsonl")) / 1e6
        triage_dir, report_dir = args.work / f"triage-{n}", args.work / f"report-{n}"
        triage_args = ["--input", str(data), "--output", str(triage_dir), "--report-output", str(report_dir)]
        result = results[n] = {"mb": mb, "triage": [], "copy": [], "peak": 0}
        for attempt in range(1, args.repeat + 1):
            # end to end in one application (triage --report-output), as the operator runs it with report_output
            t_triage, rss_triage, summary = run(job_path("triage"), triage_args)
            # the floor: Spark reading the same records and writing them back, nothing of ours in between
            t_copy, _, copied = run(COPY_SCRIPT, ["--input", str(data), "--output", str(args.work / f"copy-{n}")])
            if copied["rows"] != summary["records"]:
                raise SystemExit(f"the copy read {copied['rows']:,} records, triage {summary['records']:,}")
            result["triage"].append(t_triage)
            result["copy"].append(t_copy)
            result["peak"] = max(result["peak"], rss_triage)
            result["rows"] = summary["rows"]
            cpu = summary["cpu"]
            run_label = f" run {attempt}/{args.repeat}" if args.repeat > 1 else ""
            print(f"  {n:>9,}{run_label}: triage+report {t_triage:5.1f} s (machine CPU: user {cpu['user']:.1f} s, "
                  f"sys {cpu['sys']:.1f} s, I/O wait {cpu['iowait']:.1f} s, steal {cpu['steal']:.1f} s), Spark copy "
                  f"{t_copy:5.1f} s ({t_triage / t_copy:.2f}× the copy), peak {rss_triage / 2**30:.2f} GiB, "
                  f"{summary['rows']:,} rows ({summary['duplicates_removed']:,} duplicates)", flush=True)
        # the standalone report job on the same Parquet, for comparison
        result["report"], result["report_peak"], _ = run(job_path("report"), ["--input", str(triage_dir),
                                                                              "--output", str(report_dir)])
        print(f"  {n:>9,}: report alone {result['report']:5.1f} s, peak {result['report_peak'] / 2**30:.2f} GiB",
              flush=True)
    several = args.repeat > 1
    print(f"\n| records | input MB | triage + report (one app) s{', median (range)' if several else ''} "
          "| peak RSS GiB | report alone s | its peak GiB | rows out | Spark copy s | vs copy | time vs previous |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    previous = None
    for n, r in results.items():
        t1, t_copy = statistics.median(r["triage"]), statistics.median(r["copy"])
        ratio = f"{t1 / previous[1]:.2f}× for {n / previous[0]:.0f}× data" if previous else "—"
        print(f"| {n:,} | {r['mb']:.0f} | {_spread(r['triage'])} | {r['peak'] / 2**30:.2f} | {r['report']:.1f} "
              f"| {r['report_peak'] / 2**30:.2f} | {r['rows']:,} | {_spread(r['copy'])} | {t1 / t_copy:.2f}× "
              f"| {ratio} |")
        previous = (n, t1)
    print("\ngoals" + (f" (medians of {args.repeat} runs)" if several else "") + ":")
    for line in goal_lines(results):
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
