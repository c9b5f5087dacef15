"""One line naming the machine a benchmark ran on, printed first by every run, so recorded numbers say where they
come from: the 2-core machines the benchmarks run on are not always the same CPU model, and a model change moves
the Spark timings more than most code changes do."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess

__all__ = ["describe"]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> str:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return "?"
    return f"{pages * size / 2**30:.0f}"


def _java() -> str | None:
    java = shutil.which("java")
    if java is None:
        return None
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (done.stderr or done.stdout).splitlines()
    return lines[0].strip() if lines else None


def describe(java: bool = False) -> str:
    """``machine: <CPU model>, <n> cores, <GiB> GiB, Linux <release>, Python <version>[, <java -version>]``.

    :param java: add the first line of ``java -version`` (the Spark benchmark's JVM).
    """
    parts = [_cpu_model(), f"{os.cpu_count()} cores", f"{_memory_gib()} GiB",
             f"{platform.system()} {platform.release()}", f"Python {platform.python_version()}"]
    if java and (version := _java()):
        parts.append(version)
    return "machine: " + ", ".join(parts)


if __name__ == "__main__":
    print(describe(java=True))
