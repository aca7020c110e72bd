#!/usr/bin/env bash
# The README's main job: set up .venv (what training needs), then a short real ERPO training run on the embedded
# default (offline, CPU).
# Extra arguments go to the example, e.g. `bash scripts/train.sh --max_steps 20`.
set -euo pipefail
cd "$(dirname "$0")/.."
SETUP_FOR=train bash scripts/setup_env.sh  # torch and trl-variants: what training needs, no test tools
export HF_HUB_DISABLE_TELEMETRY=1
# Offline only where the run is the embedded default (no model, data or recipe named): a Hub model or dataset must
# be allowed to download.
case " $* " in
    *" --model_name_or_path"*|*" --dataset_name"*|*" --datasets"*|*" --config"*) ;;
    *) export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 ;;
esac
exec .venv/bin/accelerate launch --num_processes 1 --mixed_precision no examples/train_erpo.py "$@"
