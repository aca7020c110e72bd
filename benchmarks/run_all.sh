#!/usr/bin/env bash
# Reproduce every number and plot of docs/RESULTS.md on a CPU machine (about 50 minutes on 2 cores):
#   bash benchmarks/run_all.sh            # tiny-model benchmarks, stage 1, EEPO clip study, replication
#   bash benchmarks/run_all.sh --extended # also the 25M-parameter and 32k-vocabulary benchmarks and ERPO on a
#                                         # prompt-trained base (about 50 more minutes; --medium is an alias)
# Uses ./.venv (created by scripts/setup_env.sh). Run it on an otherwise idle machine: timings are compared as
# ratios within each run, but other load adds noise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
PY=.venv/bin/python
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
$PY benchmarks/bench_trainers.py --variants grpo_beta0 grpo_beta erpo eepo dph grpo_g2 grpo_g2_paper apo a2po \
    --reps 3 --steps 8 --out docs/benchmarks
$PY benchmarks/bench_trainers.py --variants grpo_g2 grpo_g2_paper apo a2po --batch 64 --G 2 --reps 3 --steps 8 \
    --out docs/benchmarks_apo32
$PY benchmarks/bench_fused_head.py --model tiny --out docs/bench_fused_head_tiny
$PY benchmarks/bench_presample.py
$PY benchmarks/eepo_eps_study.py
$PY benchmarks/replicate.py
if [ "${1:-}" = "--extended" ] || [ "${1:-}" = "--medium" ]; then
  $PY benchmarks/bench_trainers.py --model medium --variants grpo_beta0 grpo_beta erpo eepo dph grpo_g2 apo a2po \
      --reps 2 --steps 4 --warmup 2 --out docs/benchmarks_medium
  $PY benchmarks/bench_trainers.py --model bigvocab --variants grpo_g2 apo a2po --batch 64 --G 2 --reps 2 --steps 4 \
      --warmup 1 --out docs/benchmarks_bigvocab32
  $PY benchmarks/bench_fused_head.py
  $PY scripts/build_tiny_default.py --init_from trl_variants/default/assets --prompt_loss --lr 1e-3 --warmup 10 \
      --max_steps 400 --eval_every 400 --stop_low 0 --stop_high 1 --threads 2 --out outputs/tiny-prompt-trained
  $PY benchmarks/replicate.py --methods grpo erpo --base_model outputs/tiny-prompt-trained \
      --out docs/replication_prompt_trained
fi
echo "done: see docs/benchmarks.md, docs/bench_presample.md, docs/eepo_eps_study.md, docs/replication/"
