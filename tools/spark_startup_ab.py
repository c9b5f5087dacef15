"""Weigh a Spark start-up aid: the triage + report with and without it, interleaved run by run.

The 2-core machines the benchmarks run on drift by ±30 % from one minute to the next, so a saving is only
believable as a ratio between runs made in the same minutes. This runs each variant once per round, rotating
their order from round to round, with the Spark copy (``benchmarks/spark_copy.py``, plain recommended
settings) in every round as the reference, and prints every run and each variant's median ratio to the copy
of its own round.

Variants (``--variants``, comma-separated; default all):

* ``archive``: the recommended local settings plus the driver class-data archive (built under ``--work``
  first, its build time printed);
* ``plain``: the recommended local settings (what the operator submits without an archive);
* ``defaults``: Spark's defaults with only the settings the jobs rely on (no UI, checksums off, Parquet row
  groups that fit the heap), for weighing the tuning of ``LOCAL_CONF`` itself;
* ``NAME:KEY=VALUE[;KEY=VALUE]``: the recommended settings with these overrides.

Run: ``.venv/bin/python tools/spark_startup_ab.py --sizes 100000,1000000 --rounds 3``. Outside the wheel:
an experiment's tool, not part of the provider.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from generate_dead_letters import generate  # noqa: E402
from machine import describe  # noqa: E402

from airflow_provider_babelqueue.spark import job_path, recommended_conf  # noqa: E402
from airflow_provider_babelqueue.spark.class_archive import build_class_archive, with_archive  # noqa: E402

__all__ = ["main", "variants"]

COPY_SCRIPT = str(ROOT / "benchmarks" / "spark_copy.py")
#: The local settings the jobs' outputs or logs depend on (see docs/spark.md); everything else is tuning.
_NEEDED = ("spark.ui.enabled", "spark.driver.memory", "spark.babelqueue.localChecksums",
           "spark.hadoop.parquet.block.size")


def variants(names: list[str], archive: Path) -> dict[str, dict[str, str]]:
    """The Spark settings of each named variant (see the module doc).

    :param names: the variants to run, in order.
    :param archive: where the ``archive`` variant's class archive is (built here when missing).
    """
    local = recommended_conf("local[2]")
    chosen: dict[str, dict[str, str]] = {}
    for name in names:
        if name == "plain":
            chosen[name] = local
        elif name == "defaults":
            chosen[name] = {key: value for key, value in local.items() if key in _NEEDED}
        elif name == "archive":
            if not archive.exists():
                started = time.perf_counter()
                build_class_archive(archive)
                print(f"class archive built in {time.perf_counter() - started:.1f} s: {archive}", flush=True)
            chosen[name] = with_archive(local, archive)
        elif ":" in name:
            label, overrides = name.split(":", 1)
            chosen[label] = recommended_conf("local[2]", dict(item.split("=", 1) for item in overrides.split(";")))
        else:
            raise SystemExit(f"unknown variant {name!r}")
    return chosen


def _run(script: str, args: list[str], conf: dict[str, str]) -> float:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    command = [shutil.which("spark-submit", path=env["PATH"]) or "spark-submit", "--master", "local[2]"]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    started = time.perf_counter()
    done = subprocess.run([*command, script, *args], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{script} failed ({done.returncode}): {done.stderr[-2000:]}")
    if "Unable to use shared archive" in done.stderr:
        print("  the JVM refused the class archive (another JDK or Spark?): rebuild it", flush=True)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print every run (JSON) and the medians.

    :param argv: the arguments (default ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="comma-separated record counts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default="archive,plain,defaults")
    parser.add_argument("--work", type=Path, default=Path("/tmp/babelqueue-spark-ab"))
    args = parser.parse_args(argv)
    print(describe(java=True), time.strftime("%Y-%m-%d"), flush=True)
    args.work.mkdir(parents=True, exist_ok=True)
    confs = variants(args.variants.split(","), args.work / "spark-driver.jsa")
    copy_conf = recommended_conf("local[2]")
    names = [*confs, "copy"]
    for n in (int(size) for size in args.sizes.split(",")):
        data = args.work / f"in-{n}"
        if not (data / ".complete").exists():
            shutil.rmtree(data, ignore_errors=True)
            generate(n, data, files=8)
            (data / ".complete").touch()
            os.sync()
        ratios: dict[str, list[float]] = {name: [] for name in confs}
        walls: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(args.rounds):
            shift = round_ % len(names)
            wall = {}
            for name in names[shift:] + names[:shift]:
                if name == "copy":
                    wall[name] = _run(COPY_SCRIPT, ["--input", str(data), "--output", str(args.work / "copy")],
                                      copy_conf)
                else:
                    wall[name] = _run(job_path("triage"), ["--input", str(data), "--output", str(args.work / "t"),
                                                           "--report-output", str(args.work / "r")], confs[name])
                print(json.dumps({"size": n, "round": round_, "variant": name, "wall": round(wall[name], 2),
                                  "at": time.strftime("%H:%M:%S")}), flush=True)
            for name in names:
                walls[name].append(wall[name])
            for name in confs:
                ratios[name].append(wall[name] / wall["copy"])
        for name in names:
            ratio = f", {statistics.median(ratios[name]):.2f}× the copy" if name in ratios else ""
            print(f"{n:>9,} {name:>10}: median {statistics.median(walls[name]):.1f} s{ratio}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
