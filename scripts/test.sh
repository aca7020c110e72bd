#!/usr/bin/env bash
# The README's test command: set up .venv, then run the whole test suite (CPU, offline; its time on a clean clone: results/test_suite/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
exec .venv/bin/python -m pytest "$@"
