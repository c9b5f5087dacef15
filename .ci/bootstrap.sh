#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs the pinned lock plus this package in editable mode.
# Idempotent: a stamp of the inputs makes a second run return at once.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
UV_VERSION=0.13.8
VENV=.venv
PY=$VENV/bin/python

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "bootstrap: $PYTHON was not found on PATH; install Python 3.11 or set PYTHON=/path/to/python3.11" >&2
    exit 1
fi

stamp=$VENV/.bootstrap-stamp
want=$(cat pyproject.toml requirements/ci.lock .ci/bootstrap.sh | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi

echo "bootstrap: preparing $VENV (first run takes about a minute)"
[[ -x $PY ]] || "$PYTHON" -m venv "$VENV"
"$PY" -m pip install --quiet "uv==$UV_VERSION"
UV=$VENV/bin/uv
# The lock needs no excludes: the spark extra keeps the Spark provider below 6, whose releases require
# pyspark-client (it would install its own `pyspark` over pyspark 4.3.0's files).
"$UV" pip install --python "$PY" --quiet -r requirements/ci.lock
"$UV" pip install --python "$PY" --quiet --no-deps -e .

"$PY" -c "import pyspark, sys; v = pyspark.__version__; sys.exit(0 if v == '4.3.0' else f'pyspark is {v}, expected 4.3.0')"

echo "$want" > "$stamp"
echo "bootstrap: ready ($("$PY" --version), $("$PY" -c 'import airflow; print("airflow", airflow.__version__)' 2>/dev/null))"
