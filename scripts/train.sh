#!/usr/bin/env bash
# The README's main job: set up .venv, then a short real ERPO training run on the embedded default (offline, CPU).
# Extra arguments go to the example, e.g. `bash scripts/train.sh --max_steps 20`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
exec .venv/bin/accelerate launch --num_processes 1 --mixed_precision no examples/train_erpo.py "$@"
