#!/usr/bin/env bash
# The whole suite: bootstrap, services, a throwaway Airflow home with a migrated metadata DB, lint, pytest.
# Extra arguments go to pytest (e.g. `bash .ci/test.sh -k envelope`).
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
ruff check airflow_provider_babelqueue tests benchmarks dags

echo "test: pytest"
pytest "$@"
