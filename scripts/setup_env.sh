#!/usr/bin/env bash
# Create ./.venv (if missing) and install trl-variants with its test extras. Needs only python3 (>= 3.10) and pip.
# torch comes from pip; 2.13.0 is the version CI uses (any torch >= 2.6 works). Set TORCH_SPEC to choose another.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
.venv/bin/python -m pip install -q -e ".[dev]"
