#!/usr/bin/env bash
# System packages the test suite needs beyond the Python venv. Idempotent: safe to run on every `make test`.
# - chromium: headless browser that renders the Spark triage report (tests/spark/test_report_html.py).
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
  SUDO="sudo"
fi

if ! command -v chromium >/dev/null 2>&1; then
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends chromium
fi
chromium --version
