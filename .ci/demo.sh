#!/usr/bin/env bash
# `make demo`: bootstrap, a local Airflow home on SQLite, real dead letters on the embedded SQLite queue, and the
# sample triage DAG end to end (`airflow dags test`, Spark local). Everything lives under .demo/; re-running
# starts from an empty queue.
set -euo pipefail
cd "$(dirname "$0")/.."

bash .ci/bootstrap.sh
java -version >/dev/null 2>&1 || { echo "demo: Spark needs a Java runtime (17 or newer) on PATH" >&2; exit 1; }

DEMO="$PWD/.demo"
export PATH="$PWD/.venv/bin:$PATH"
export AIRFLOW_HOME="$DEMO/airflow"
export AIRFLOW__CORE__DAGS_FOLDER="$PWD/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[2]"}'
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
mkdir -p "$AIRFLOW_HOME"

echo "demo: airflow db migrate (AIRFLOW_HOME=$AIRFLOW_HOME)"
if ! airflow db migrate >"$DEMO/db-migrate.log" 2>&1; then
    tail -40 "$DEMO/db-migrate.log" >&2
    exit 1
fi
python -m tools.demo --output-root "$DEMO/runs"
echo
echo "demo: to open the dead-letter console on this Airflow home, run"
echo "  PATH=$PWD/.venv/bin:\$PATH AIRFLOW_HOME=$AIRFLOW_HOME AIRFLOW__CORE__DAGS_FOLDER=$PWD/dags AIRFLOW__CORE__LOAD_EXAMPLES=False airflow standalone"
echo "then open http://localhost:8080/plugin/babelqueue (user admin; its password is in"
echo "$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated) and load the queue 'orders' on babelqueue_default."
