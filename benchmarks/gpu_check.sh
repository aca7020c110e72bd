#!/usr/bin/env bash
# The project's GPU check: on one GPU (an H100 or H200 with torch preinstalled), in at most --budget seconds (default
# 480), run what a GPU user runs and write results/gpu/gpu_check.md with the device's name:
#   1. each method's command line for a few steps in bf16 (erpo, eepo, dph, apo, composed, grpo)
#   2. the main job to its end: `trl-variants train erpo` (the tiny recipe, 100 steps) on the GPU in bf16
#   3. `trl-variants evaluate` on the model it trained
#   4. DeepSpeed ZeRO-2 (configs/accelerate/zero2.yaml, one process, bf16 weights with fp32 master copies): erpo, dph
#      and eepo for a few steps; EEPO's unlearning step edits the bf16 weights there, so the report sets its
#      eepo/stage1_logp_change and eepo/unlearning_step_kept beside the fp32-weight smoke run's (skipped where
#      deepspeed is not installed); FSDP2 (configs/accelerate/fsdp2.yaml, one process): erpo, dph, eepo and apo,
#      each with a held-out evaluation at its last step (it gathers the full weights under FSDP2)
#   5. benchmarks/bench_trainers.py --gpu on a Qwen2.5-0.5B-shaped model (random weights), with HF generate, then
#      with transformers' continuous batching (the per-regime speed targets, results/gpu/bench_*.md)
# Each step has its own time box, cut to what is left of the budget (the smoke and ZeRO-2 runs go side by side first,
# then the FSDP2 runs, within their own boxes of 60-90 s); a step that did not fit is written down as skipped. The slowest and
# least certain steps come last.
#
#   bash benchmarks/gpu_check.sh --dry-run            # print the commands it would run, run nothing
#   bash benchmarks/gpu_check.sh --fetch-wheels DIR   # here (with the package registry): the wheels a bare GPU
#                                                     # machine lacks, and the project's own wheel, into DIR
#   bash benchmarks/gpu_check.sh --wheels DIR         # there: install DIR's wheels (no index, no deps), then run
#
# Options: --out DIR (results go to DIR/results/gpu and runs to DIR/work; default: $OUT when set, then the runs go to
# $TMPDIR and the results also to $OUT/gpu_check.tar.gz; else the repository), --budget SECONDS (the whole run, the wheels' install included), --python PY (default python3), --only
# NAME[,NAME...] (those steps alone, e.g. bench_hf_generate), --reps N (the benchmarks' repetitions, default 1; their
# time boxes grow with it), --variants "V1 V2 ..." (the benchmarks' variants of bench_trainers.py, default all six
# below), --batch N (the benchmarks' completions per step, default 64; another N writes results/gpu/bench_*_bN.md
# beside the 64-row files, e.g. to look for the batch where continuous batching becomes throughput-bound).
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0; WHEELS=""; FETCH=""; BUDGET=480; PY=python3; BASE=${OUT:-}; FROM_OUT=${OUT:+1}; ONLY=""; REPS=1; VARIANTS=""; BATCH=64
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --wheels) WHEELS=$2; shift ;;
        --fetch-wheels) FETCH=$2; shift ;;
        --budget) BUDGET=$2; shift ;;
        --out) BASE=$2; FROM_OUT=""; shift ;;
        --python) PY=$2; shift ;;
        --only) ONLY=$2; shift ;;
        --reps) REPS=$2; shift ;;
        --variants) VARIANTS=$2; shift ;;
        --batch) BATCH=$2; shift ;;
        -h|--help) sed -n '2,/^set -uo/{/^#/p}' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

# What a bare GPU machine with torch, accelerate, peft and transformers lacks (measured on an H100 machine), at the
# versions this project is tested with; pure-Python wheels.
# datasets' dill and multiprocess are not in that image's package list (2026-11-17); multiprocess's wheels are per
# Python version, hence the machine's Python (3.12) when fetching.
CARRY=(trl==1.16.0 transformers==5.24.0 datasets==5.2.0 math-verify==0.9.0 "latex2sympy2_extended==1.11.0"
       "antlr4-python3-runtime==4.13.2" dill==0.4.1 multiprocess==0.70.19)
# DeepSpeed (the ZeRO-2 steps) and what it needs beyond that image: deepspeed itself is built here as a pure-Python
# wheel (its CUDA ops compile on first use, and the trainers use torch's AdamW, so none is built); pydantic-core is
# compiled, hence the platform
CARRY_DS=(pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 hjson==3.1.0)
PLATFORMS=(--implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

if [ -n "$FETCH" ]; then
    mkdir -p "$FETCH"
    "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d "$FETCH" "${CARRY[@]}" || exit 1
    "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 "${PLATFORMS[@]}" -d "$FETCH" "${CARRY_DS[@]}" || exit 1
    "$PY" -m pip wheel --no-deps -w "$FETCH" deepspeed==0.19.8 || exit 1
    "$PY" -m pip wheel --no-deps -w "$FETCH" . || exit 1
    ls -1 "$FETCH"
    exit 0
fi

RESULTS=${BASE:+$BASE/}results/gpu
# under the device tool's $OUT only what is at most 2 folders down comes back: the runs' files stay in /tmp there, and
# the results (the logs are 3 folders down) come back as one archive, $OUT/gpu_check.tar.gz
if [ -n "$FROM_OUT" ]; then WORK=${TMPDIR:-/tmp}/gpu_check_work; else WORK=${BASE:+$BASE/}work/gpu_check; fi
TRAIN="$PY -m trl_variants train"
SMOKE_FLAGS="--use_cpu false --bf16 true --max_steps 4 --heldout_eval_steps 0 --embedded_train_size 256 --save_strategy no --report_to none --logging_steps 1"
case $BATCH in ''|*[!0-9]*) echo "gpu_check: --batch takes a number of completions, got '$BATCH'" >&2; exit 2 ;; esac
TAG=$([ "$BATCH" -eq 64 ] || echo "_b$BATCH")  # results of another batch go beside the 64-row ones
BENCH="$PY benchmarks/bench_trainers.py --gpu --model qwen0.5b_shape --batch $BATCH --G 8 --max_completion_length 128 --steps 2 --warmup 1 --reps $REPS --threads 8"
# the variants of each target side by side, the first targets' first (a run cut by its time box keeps what finished)
BENCH_VARIANTS=${VARIANTS:-"grpo_beta0 grpo_two_generates eepo grpo_g2_half apo grpo_g2"}

# name | time box (s) | command
STEPS=()
for m in erpo eepo dph apo composed grpo; do
    STEPS+=("smoke_$m|60|$TRAIN $m $SMOKE_FLAGS --output_dir $WORK/smoke-$m")
done
# ZeRO-2 on one GPU, side by side with the smoke runs (each its own rendezvous port)
ZERO2="$PY -m accelerate.commands.launch --config_file configs/accelerate/zero2.yaml --num_processes 1"
port=29511
for m in erpo dph eepo; do
    STEPS+=("zero2_$m|90|$ZERO2 --main_process_port $port -m trl_variants train $m $SMOKE_FLAGS --output_dir $WORK/zero2-$m")
    port=$((port + 1))
done
# FSDP2 on one GPU (configs/accelerate/fsdp2.yaml: bf16 mixed precision, float32 master weights; Accelerate starts it
# through torchrun even for one process), side by side after the first wave; no extra wheel needed
FSDP2="$PY -m accelerate.commands.launch --config_file configs/accelerate/fsdp2.yaml --num_processes 1"
# and a held-out evaluation at their last step (64 prompts): it gathers the full weights under FSDP2
# (_model.whole_policy_for_generation), which failed under torch 2.11 until 2026-11-28
FSDP2_HELDOUT="--heldout_eval_steps 4 --embedded_test_size 64"
for m in erpo dph eepo apo; do
    STEPS+=("fsdp2_$m|90|$FSDP2 --main_process_port $port -m trl_variants train $m $SMOKE_FLAGS $FSDP2_HELDOUT --output_dir $WORK/fsdp2-$m")
    port=$((port + 1))
done
STEPS+=("main_job|300|$TRAIN erpo --use_cpu false --bf16 true --save_strategy no --output_dir $WORK/main")
STEPS+=("evaluate|90|$PY -m trl_variants evaluate --models $WORK/main --max_prompts 200 --k 4 --temperatures 1.0 --output_dir $WORK/eval")
# HF generate first: about 30-45 s a variant on an H100 (results/gpu/README.md), so the every-device targets fit;
# transformers' continuous batching took longer there (over 90 s a variant) and gets what is left
STEPS+=("bench_hf_generate|$((200 * REPS))|$BENCH --variants $BENCH_VARIANTS --out $RESULTS/bench_hf_generate$TAG")
STEPS+=("bench_continuous_batching|$((180 * REPS))|$BENCH --continuous_batching --variants $BENCH_VARIANTS --out $RESULTS/bench_continuous_batching$TAG")

if [ -n "$ONLY" ]; then
    KEPT=()
    for step in "${STEPS[@]}"; do
        case ",$ONLY," in *",${step%%|*},"*) KEPT+=("$step") ;; esac
    done
    if [ ${#KEPT[@]} -eq 0 ]; then
        echo "gpu_check: --only $ONLY names no step; the steps: $(for s in "${STEPS[@]}"; do printf '%s ' "${s%%|*}"; done)" >&2
        exit 2
    fi
    STEPS=("${KEPT[@]}")
fi

if [ "$DRY" -eq 1 ]; then
    for step in "${STEPS[@]}"; do
        IFS='|' read -r name box cmd <<< "$step"
        printf '%s\t%s\t%s\n' "$name" "$box" "$cmd"
    done
    exit 0
fi

# The budget counts from here, the wheels' install included (a device call's time limit of the budget plus a minute
# then leaves time for the report and for copying it out: on 2026-11-27 a call whose limit did not allow for the
# install lost a whole benchmark's output)
START=$SECONDS
if [ -n "$WHEELS" ]; then
    SITE=$(pwd)/.gpu_site
    rm -rf "$SITE"  # a machine kept warm between calls holds the last call's copy: pip --target would not replace it
    "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl || exit 1
    # the working tree first (the scripts under benchmarks/ would import the installed wheel's copy otherwise); the
    # wheel gives the package's metadata (its version, read by the offline pass)
    export PYTHONPATH="$(pwd):$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONUNBUFFERED=1
DEVICE=$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>/dev/null)
if [ -z "$DEVICE" ]; then
    echo "gpu_check: no CUDA device visible to $PY (torch.cuda.is_available() is False): run it on a GPU machine, or use --dry-run" >&2
    exit 1
fi
mkdir -p "$RESULTS" "$WORK/logs"
rm -rf "$WORK"/logs/* "$WORK/cache"  # a report must not read an earlier run's logs, nor a step an earlier pass
REPORT=$RESULTS/gpu_check.md
VERSIONS=$("$PY" -c '
import importlib.metadata as m

def version(p):
    try:
        return m.version(p)
    except m.PackageNotFoundError:
        return "not installed"

print(", ".join(f"{p} {version(p)}" for p in ("torch", "transformers", "trl", "accelerate", "datasets", "peft", "deepspeed", "trl-variants")))' 2>&1)
HAS_DEEPSPEED=0
"$PY" -c "import deepspeed" > /dev/null 2>&1 && HAS_DEEPSPEED=1
{
    echo "# GPU check: $DEVICE"
    echo
    echo "Written by \`bash benchmarks/gpu_check.sh\` on $(date -u +%Y-%m-%d) at commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $VERSIONS."
    echo "Budget ${BUDGET} s; each step's time box is cut to what is left of it."
    echo
    echo "| step | status | seconds | command |"
    echo "|---|---|---|---|"
} > "$REPORT"

# run_step NAME BOX CMD: one step under its time box, one row in the report; a failing step's last lines are kept
run_step() {
    local name=$1 box=$2 cmd=$3 t0=$SECONDS rc dt status
    echo "gpu_check: $name (up to ${box} s): $cmd"
    # each step its own offline-pass cache: the smoke and ZeRO-2 runs of a method would share one key (same flags,
    # same data) and the later one would read what the earlier wrote instead of making its own pass
    TRL_VARIANTS_CACHE="$WORK/cache/$name" timeout "$box" bash -c "$cmd" > "$WORK/logs/$name.log" 2>&1
    rc=$?
    dt=$((SECONDS - t0))
    case $rc in
        0) status=ok ;;
        124|137) status="timed out at ${box} s" ;;
        *) status="failed (exit $rc)" ;;
    esac
    echo "| $name | $status | $dt | \`$cmd\` |" >> "$REPORT"
    [ "$rc" -eq 0 ] || { echo; echo "### $name: last lines"; echo '```'; tail -n 25 "$WORK/logs/$name.log"; echo '```'; } > "$WORK/logs/$name.failure"
}

# The smoke and ZeRO-2 runs (tiny model, a few steps; their speed is not measured) run side by side, then the FSDP2
# runs; the rest one at a time.
for step in "${STEPS[@]}"; do
    IFS='|' read -r name box cmd <<< "$step"
    case $name in
        zero2_*) if [ "$HAS_DEEPSPEED" -eq 0 ]; then
                     echo "| $name | skipped: deepspeed is not installed (--fetch-wheels carries it) | 0 | \`$cmd\` |" >> "$REPORT"
                     continue
                 fi
                 run_step "$name" "$box" "$cmd" & ;;
        smoke_*) run_step "$name" "$box" "$cmd" & ;;
    esac
done
wait
# FSDP2 next, side by side among themselves (three more torchrun-started processes would crowd the first wave)
for step in "${STEPS[@]}"; do
    IFS='|' read -r name box cmd <<< "$step"
    case $name in fsdp2_*) run_step "$name" "$box" "$cmd" & ;; esac
done
wait
for step in "${STEPS[@]}"; do
    IFS='|' read -r name box cmd <<< "$step"
    case $name in smoke_*|zero2_*|fsdp2_*) continue ;; esac
    left=$((BUDGET - (SECONDS - START)))
    if [ "$left" -lt 20 ]; then
        echo "| $name | skipped: budget spent | 0 | \`$cmd\` |" >> "$REPORT"
        continue
    fi
    [ "$box" -gt "$left" ] && box=$left
    run_step "$name" "$box" "$cmd"
done
cat "$WORK"/logs/*.failure > "$RESULTS/gpu_check_failures.md" 2>/dev/null || rm -f "$RESULTS/gpu_check_failures.md"
[ -s "$RESULTS/gpu_check_failures.md" ] || rm -f "$RESULTS/gpu_check_failures.md"

{
    echo
    echo "## Main job: held-out accuracy"
    echo '```'
    grep -A3 "held-out accuracy" "$WORK/logs/main_job.log" 2>/dev/null || echo "(no summary: see the steps above)"
    echo '```'
    echo
    echo "## Evaluation of the main job's model"
    echo '```'
    grep -iE "device|greedy|avg@|pass@|length limit|warning" "$WORK/logs/evaluate.log" 2>/dev/null | head -20 || true
    echo '```'
    if [ -f "$WORK/logs/zero2_eepo.log" ]; then
        echo
        echo "## EEPO's unlearning step: fp32 weights (smoke_eepo) and ZeRO-2's bf16 weights (zero2_eepo)"
        echo
        echo "Per logged step: eepo/stage1_logp_change, how much the step lowered stage 1's summed log-probs (near 0: the"
        echo "step was lost to rounding), and eepo/unlearning_step_kept, the first-order share of the step the weights kept"
        echo "(about 1 with float32 weights)."
        echo '```'
        for metric in stage1_logp_change unlearning_step_kept; do
            for s in smoke_eepo zero2_eepo; do
                echo "$s $metric: $(grep -o "'eepo/$metric': '[^']*" "$WORK/logs/$s.log" 2>/dev/null | sed "s/.*'//" | tr '\n' ' ')"
            done
        done
        echo '```'
    fi
    for b in bench_hf_generate bench_continuous_batching; do
        if [ -f "$RESULTS/$b$TAG.md" ]; then
            echo
            echo "## $b$TAG"
            echo
            cat "$RESULTS/$b$TAG.md"
        elif grep -q "^rep " "$WORK/logs/$b.log" 2>/dev/null; then
            echo
            echo "## $b (cut short: the variants that finished)"
            echo '```'
            grep "^rep " "$WORK/logs/$b.log"
            echo '```'
        fi
    done
    if [ -f "$RESULTS/gpu_check_failures.md" ]; then
        echo
        echo "## Failures"
        cat "$RESULTS/gpu_check_failures.md"
    fi
} >> "$REPORT"
rm -f "$RESULTS/gpu_check_failures.md"
mkdir -p "$RESULTS/logs"
for f in "$WORK"/logs/*.log; do tail -n 200 "$f" > "$RESULTS/logs/$(basename "$f")"; done
[ -z "$FROM_OUT" ] || tar -czf "$BASE/gpu_check.tar.gz" -C "$BASE" results/gpu
echo "gpu_check: wrote $REPORT ($((SECONDS - START)) s)${FROM_OUT:+ and $BASE/gpu_check.tar.gz}"
