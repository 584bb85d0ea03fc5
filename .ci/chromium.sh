#!/usr/bin/env bash
# Debian's chromium for the real-browser check of the MLflow UI (tests/test_system_metrics.py,
# docs/mlflow_ui_shots.py); the test skips, saying so, where it is missing.
set -euo pipefail
if ! command -v chromium >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
