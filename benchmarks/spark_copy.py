"""The Spark floor under the triage benchmark: read the same drain records and write them back as Parquet.

``bench_spark.py`` runs it with the same settings and input as the triage (``tools/spark_startup_ab.py`` in
every round of its comparison), so the ratio (triage + report) / copy says how much our job adds to what Spark
itself needs to read these records and write a columnar copy on the machine at hand. That ratio travels
between machines better than seconds do: the 2-core machines the benchmark runs on change speed by a factor of
two from one hour to the next.

Run: ``spark-submit spark_copy.py --input <drain folder> --output <folder>`` (``bench_spark.py`` does).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from airflow_provider_babelqueue.spark.common import base_parser, get_spark, stop_spark
from airflow_provider_babelqueue.spark.triage import read_records


def main(argv: Sequence[str] | None = None) -> int:
    args = base_parser("Spark floor: drain records (JSON Lines) → Parquet, nothing else").parse_args(argv)
    spark = get_spark(args.app_name or "babelqueue-bench-copy")
    try:
        # triage's own reader (same schema, options and filter), and nothing of what triage does after it
        read_records(spark, args.input).write.mode("overwrite").parquet(args.output)
        rows = spark.read.parquet(args.output).count()
        print(json.dumps({"job": "copy", "rows": rows}), flush=True)
        return 0
    finally:
        stop_spark(spark)


if __name__ == "__main__":
    sys.exit(main())
