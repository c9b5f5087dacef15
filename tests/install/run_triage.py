"""Run by tests/install/test_pip_install.py with the fresh environment's Python, never by pytest.

It imports the provider from that environment (not from the repository: the folder of this script holds no
package) and runs ``BabelQueueSparkTriageOperator`` once, outside any DAG run: triage of the drain records in
``argv[1]`` into ``argv[2]`` through the Spark provider's ``SparkSubmitOperator`` and the environment's own
``spark-submit``. The connection is ``argv[3]`` (the test defines it in the environment). The last line of
stdout is ``RESULT <json>``: where the provider and the Spark provider were imported from, and the operator's
return value.
"""

from __future__ import annotations

import json
import sys

import airflow.providers.apache.spark as spark_provider

import airflow_provider_babelqueue
from airflow_provider_babelqueue.operators.spark import BabelQueueSparkTriageOperator


def main(drain_dir: str, output_dir: str, conn_id: str) -> None:
    operator = BabelQueueSparkTriageOperator(task_id="install_check_triage", job="triage", input=drain_dir,
                                             output=output_dir, conn_id=conn_id,
                                             conf={"spark.sql.shuffle.partitions": "2"})
    result = operator.execute({})
    print("RESULT " + json.dumps({"package": airflow_provider_babelqueue.__file__,
                                  "spark_provider": spark_provider.__file__, "returned": result}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
