#!/usr/bin/env bash
# The README's test command: set up .venv, then run the whole test suite (CPU, offline; its time on a clean clone: results/test_suite/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
# Two pytest-xdist workers where there are two cores or more (each test then runs torch on one thread,
# trainers_tests/conftest.py): on 2 cores the suite takes about a fifth less time than in one process.
# TRL_VARIANTS_TEST_WORKERS=0 runs it in one process; so do --pdb and -p no:xdist; an -n of your own wins.
cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
workers=${TRL_VARIANTS_TEST_WORKERS:-$([ "$cores" -ge 2 ] && echo 2 || echo 0)}
distribute=(-n "$workers")
for arg in "$@"; do
    case "$arg" in --pdb|--trace|no:xdist|-pno:xdist|-n|-n*|--numprocesses*) distribute=() ;; esac
done
exec .venv/bin/python -m pytest "${distribute[@]}" "$@"
