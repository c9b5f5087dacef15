#!/usr/bin/env bash
# The whole suite: bootstrap, services, a throwaway Airflow home with a migrated metadata DB, lint, pytest.
# Extra arguments go to pytest (e.g. `bash .ci/test.sh -k envelope`). Two pytest-xdist workers by default
# (BABELQUEUE_TEST_WORKERS=0 runs in one process): most of the suite waits on brokers, JVMs and Airflow loops,
# so two workers on two cores roughly halve the wall time. Each worker gets its own copy of the migrated
# Airflow home (tests/conftest.py); --dist loadfile keeps a module, and the Spark modules, on one worker.
set -euo pipefail
cd "$(dirname "$0")/.."

bash .ci/bootstrap.sh
bash .ci/services.sh
bash .ci/system.sh   # Debian packages the tests drive (Chromium for the Spark report check)

export PATH="$PWD/.venv/bin:$PATH"
AIRFLOW_HOME=$(mktemp -d "${TMPDIR:-/tmp}/babelqueue-airflow.XXXXXX")
export AIRFLOW_HOME
export AIRFLOW__CORE__LOAD_EXAMPLES=False
trap 'rm -rf "$AIRFLOW_HOME"' EXIT

echo "test: airflow db migrate (AIRFLOW_HOME=$AIRFLOW_HOME)"
if ! airflow db migrate >"$AIRFLOW_HOME/db-migrate.log" 2>&1; then
    tail -40 "$AIRFLOW_HOME/db-migrate.log" >&2
    exit 1
fi

echo "test: ruff"
ruff check airflow_provider_babelqueue tests benchmarks dags tools

echo "test: mypy"
mypy

echo "test: pytest (${BABELQUEUE_TEST_WORKERS:-2} workers)"
# the slowest tests close the report: where the suite's minutes go, for keeping it within its budget
pytest -n "${BABELQUEUE_TEST_WORKERS:-2}" --dist loadfile --durations=25 "$@"
