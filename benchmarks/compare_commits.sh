#!/usr/bin/env bash
# Step time of the parts trainers at an older commit and at the working tree, back to back on this machine:
#     bash benchmarks/compare_commits.sh 1d90d4d [out_stem]
# runs `bench_trainers.py --variants grpo_beta0 grpo_beta0_accuracy erpo dph eepo parts_off --reps 5 --steps 8` on a
# git worktree of the commit (its own trl_variants first on PYTHONPATH, this .venv), then on the working tree, and
# writes <out_stem>_old.{json,md} and <out_stem>_new.{json,md} (default results/benchmarks/parts_refactor).
# Each run pairs every variant with its baseline in the same repetition; compare the paired ratios of the two files.
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: bash benchmarks/compare_commits.sh <commit> [out_stem]}
stem=${2:-results/benchmarks/parts_refactor}
variants=(grpo_beta0 grpo_beta0_accuracy erpo dph eepo parts_off)
python=$(pwd)/.venv/bin/python
tree=$(mktemp -d)/old
git worktree add -f --detach "$tree" "$old" >/dev/null
trap 'git worktree remove --force "$tree"' EXIT
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
(cd "$tree" && PYTHONPATH="$tree" "$python" benchmarks/bench_trainers.py --variants "${variants[@]}" --reps 5 --steps 8 \
    --out "$(pwd -P)/tmp_old")
mkdir -p "$(dirname "$stem")"
mv "$tree/tmp_old.json" "${stem}_old.json"; mv "$tree/tmp_old.md" "${stem}_old.md"
"$python" benchmarks/bench_trainers.py --variants "${variants[@]}" --reps 5 --steps 8 --out "${stem}_new"
echo "wrote ${stem}_old.{json,md} (commit $old) and ${stem}_new.{json,md} (working tree)"
