"""PySpark jobs for dead-letter triage and reporting (run with ``spark-submit``; no Airflow imports here).

* ``triage.py``: drain records (JSON Lines) → deduplicated, classified Parquet partitioned by reason;
* ``report.py``: triage Parquet → ``summary.json`` and a self-contained ``report.html``;
* ``replay_set.py``: triage Parquet + a policy → reset envelopes (JSON Lines), one folder per target queue,
  ready for ``BabelQueueReplayOperator(replay_set=...)``.

:func:`job_path` gives the file to hand to ``spark-submit``. Importing this package does not import pyspark.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["JOBS", "job_path"]

#: The jobs by name (the operator's ``job`` argument), each a file next to this one.
JOBS = {"triage": "triage.py", "report": "report.py", "replay_set": "replay_set.py"}


def job_path(job: str) -> str:
    """Absolute path of a job's module file, e.g. ``job_path("triage")``, for ``spark-submit``."""
    try:
        name = JOBS[job]
    except KeyError:
        raise ValueError(f"unknown Spark job {job!r}; choose one of {', '.join(sorted(JOBS))}") from None
    return str(Path(__file__).resolve().with_name(name))
