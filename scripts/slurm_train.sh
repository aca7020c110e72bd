#!/usr/bin/env bash
#SBATCH --job-name=trl-variants
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --output=%x-%j.out
# Train a recipe on several nodes of a SLURM allocation: one `accelerate launch` per node, started by srun, with the
# rendezvous (rank-0 host, port, machine count and rank, process count) taken from the job. Submit from the repo root
# with the environment (venv) active; sbatch passes it to the nodes:
#
#   sbatch --nodes 2 scripts/slurm_train.sh configs/erpo/qwen2.5-math-7b.yaml --hub_model_id <you>/erpo-7b [flags...]
#   VLLM_NODES=1 sbatch --nodes 3 scripts/slurm_train.sh configs/apo/qwen2.5-7B.yaml --push_to_hub false   # + 1 vLLM
#   bash scripts/slurm_train.sh --dry_run configs/erpo/qwen2.5-math-7b.yaml           # print the commands only
#
# Settings (environment variables):
#   GPUS_PER_NODE          processes per training node (default: SLURM_GPUS_ON_NODE, else 8)
#   METHOD                 erpo, eepo, dph or apo (default: the recipe's folder, configs/<method>/ or a copy in
#                          <dir>/<method>/)
#   ACCELERATE_CONFIG      default: the multi-node form of the backend the recipe's launch command names
#                          (zero2.yaml -> configs/accelerate/multi_node_zero2.yaml)
#   MAIN_PROCESS_PORT      rendezvous port on the first node (default 29500)
#   VLLM_NODES             0 (default): the recipe's vLLM mode (colocate); 1: the last node runs `trl vllm-serve`
#                          and the trainers use vllm_mode=server
#   VLLM_TP, VLLM_PORT, VLLM_GPU_MEMORY_UTILIZATION   the server's tensor parallel size (1), port (8000), memory (0.9)
# Preemption: with `--enable_jit_checkpoint true` a SIGTERM saves the step under way and stops (docs/reliability.md,
# "Preemption"); give it the time: `#SBATCH --signal=B:TERM@600` (to this script, which passes it to the training
# step only, not to a vLLM server's) and `export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=600` (accelerate's torchrun kills its
# workers 30 s after a SIGTERM otherwise).
# A recipe's header names the process count its batch arithmetic is written for (`# processes: 8`). On another
# count the global batch would change, so the launcher rescales gradient_accumulation_steps and steps_per_generation
# (or else, on more processes, the per-device batch sizes) by the ratio, with the trainer's own arithmetic
# (trl_variants.training.batch.recipe_batch: 8 -> 16 halves them, 8 -> 4 doubles them), says so, and refuses where no
# whole numbers keep the numbers; batch flags passed on the command line turn this off. The trainer sees the flags
# added here as batch flags set on the command line and keeps them, so the batch is rescaled once, here, and printed
# before the job starts. docs/distributed.md, "Several nodes", explains all of it.
set -euo pipefail

die() { echo "slurm_train.sh: $*" >&2; exit 2; }
DRY_RUN=0
if [[ "${1:-}" == "--dry_run" ]]; then DRY_RUN=1; shift; fi
[[ $# -ge 1 ]] || die "usage: [sbatch ...] scripts/slurm_train.sh [--dry_run] configs/<algorithm>/<recipe>.yaml [training flags...]"
RECIPE=$1; shift
EXTRA=("$@")
ROOT=${TRL_VARIANTS_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}   # sbatch runs a copy of this file: find the repo by the submit dir
cd "$ROOT"
PYTHON=${PYTHON:-python}
[[ -f "$RECIPE" ]] || die "recipe $RECIPE not found under $ROOT (submit from the repo root or set TRL_VARIANTS_ROOT)"
ALGORITHM=${METHOD:-$(basename "$(dirname "$RECIPE")")}
SCRIPT="examples/train_${ALGORITHM}.py"
[[ -f "$SCRIPT" ]] || die "no $SCRIPT for $RECIPE: a recipe lives in a folder named after its method (configs/<erpo|eepo|dph|apo>/, or a copy in <dir>/<method>/), or set METHOD=<erpo|eepo|dph|apo>"

# --- nodes of the allocation ---
[[ -n "${SLURM_JOB_NODELIST:-}" ]] || die "SLURM_JOB_NODELIST is not set: submit with sbatch (or set it for --dry_run)"
if command -v scontrol >/dev/null; then
  mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
else
  [[ "$SLURM_JOB_NODELIST" != *"["* ]] || die "scontrol is needed to expand $SLURM_JOB_NODELIST"
  IFS=, read -r -a NODES <<< "$SLURM_JOB_NODELIST"
fi
VLLM_NODES=${VLLM_NODES:-0}
[[ "$VLLM_NODES" == 0 || "$VLLM_NODES" == 1 ]] || die "VLLM_NODES=$VLLM_NODES: TRL's trainer talks to one vLLM server (vllm_server_host); use 0 or 1"
NUM_MACHINES=$(( ${#NODES[@]} - VLLM_NODES ))
(( NUM_MACHINES >= 1 )) || die "${#NODES[@]} node(s) leave no training node with VLLM_NODES=$VLLM_NODES"
TRAIN_NODES=("${NODES[@]:0:NUM_MACHINES}")
GPUS_PER_NODE=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}
NUM_PROCESSES=$(( NUM_MACHINES * GPUS_PER_NODE ))
MAIN_PROCESS_IP=${TRAIN_NODES[0]}
MAIN_PROCESS_PORT=${MAIN_PROCESS_PORT:-29500}

# --- what the recipe says (its header, launch backend, model, batch fields), and the batch flags for this count ---
RECIPE_INFO=$("$PYTHON" - "$RECIPE" "$ALGORITHM" "$NUM_PROCESSES" "${EXTRA[@]}" <<'EOF'
import re, shlex, sys
import yaml

path, method, processes, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
text = open(path).read()
raw = yaml.safe_load(text) or {}
header = re.search(r"^#\s*processes:\s*(\d+)", text, re.M)
backend = re.search(r"--config_file configs/accelerate/(\S+)\.yaml", text)
out = {"MODEL": raw.get("model_name_or_path", ""), "BACKEND": backend.group(1) if backend else "",
       "RECIPE_PROCESSES": header.group(1) if header else "", "USES_VLLM": str(bool(raw.get("use_vllm"))).lower()}
flags, note = [], ""
if header and int(header.group(1)) != processes:
    # the trainer's own arithmetic (trl_variants.training.batch.recipe_batch): the same flags it would add itself
    from trl_variants.registry import method_classes
    from trl_variants.training.batch import BATCH_FLAGS, recipe_batch

    written = int(header.group(1))
    if any(a[2:].split("=")[0].replace("-", "_") in BATCH_FLAGS for a in extra if a.startswith("--")):
        note = f"your batch flags decide the batch (the recipe's header arithmetic is for {written} processes)"
    else:
        try:
            flags, why = recipe_batch(path, extra, processes, method_classes(method)[1])
        except ValueError as e:
            sys.exit(f"{e}; on SLURM: pass the batch flags yourself after the recipe")
        note = (f"recipe written for {written} processes, launching {processes}: {' '.join(flags)} keeps its batch"
                if flags else why)
out["BATCH_NOTE"] = note


def given(name):  # the last value of --name (or --na-me) after the recipe; a bare boolean flag is "true"; else None
    values = []
    for i, a in enumerate(extra):
        flag, eq, value = a.partition("=")
        if flag.startswith("--") and flag[2:].replace("-", "_") == name:
            bare = i + 1 >= len(extra) or extra[i + 1].startswith("--")
            values.append(value if eq else ("true" if bare else extra[i + 1]))
    return values[-1] if values else None


push = given("push_to_hub")
push = bool(raw.get("push_to_hub")) if push is None else push.strip().lower() in ("true", "1", "yes")
hub = given("hub_model_id") or raw.get("hub_model_id") or ""
out["HUB_PROBLEM"] = ""
if push:
    from trl_variants.recipe_catalog import hub_push_problems  # a light module: this runs on every submission

    out["HUB_PROBLEM"] = "; ".join(p for p in hub_push_problems(hub, "hub_model_id") if "placeholder" in p)
for key, value in out.items():
    print(f"{key}={shlex.quote(value)}")
print("BATCH_ARGS=(" + " ".join(shlex.quote(f) for f in flags) + ")")
EOF
) || die "stopped before launching anything (see above)"
eval "$RECIPE_INFO"
if [[ -n "$HUB_PROBLEM" ]]; then  # every process would refuse it after the allocation started (and any vLLM server)
  [[ "$DRY_RUN" == 1 ]] || die "$HUB_PROBLEM"
  echo "trl-variants: a real job would stop here: $HUB_PROBLEM" >&2
fi

if [[ -z "${ACCELERATE_CONFIG:-}" ]]; then
  [[ -n "$BACKEND" ]] || die "$RECIPE names no accelerate config in its launch command: set ACCELERATE_CONFIG"
  ACCELERATE_CONFIG=configs/accelerate/multi_node_${BACKEND}.yaml
  [[ -f "$ACCELERATE_CONFIG" ]] || die "no $ACCELERATE_CONFIG for the recipe's $BACKEND.yaml: set ACCELERATE_CONFIG"
fi
[[ -f "$ACCELERATE_CONFIG" ]] || die "ACCELERATE_CONFIG=$ACCELERATE_CONFIG not found"

VLLM_ARGS=()
if [[ "$VLLM_NODES" == 1 ]]; then
  VLLM_NODE=${NODES[-1]}
  VLLM_PORT=${VLLM_PORT:-8000}
  VLLM_ARGS=(--use_vllm true --vllm_mode server --vllm_server_host "$VLLM_NODE" --vllm_server_port "$VLLM_PORT")
  [[ -n "$MODEL" ]] || die "$RECIPE sets no model_name_or_path for the vLLM server"
  SERVE_CMD=(trl vllm-serve --model "$MODEL" --tensor_parallel_size "${VLLM_TP:-1}" --port "$VLLM_PORT"
             --gpu_memory_utilization "${VLLM_GPU_MEMORY_UTILIZATION:-0.9}")
fi

# One node's launch command, quoted for `bash -c`; $1 is its machine rank (srun passes the literal $SLURM_PROCID,
# which each task expands to its own rank: one task per node).
launch_command() {
  printf '%q ' accelerate launch --config_file "$ACCELERATE_CONFIG" --num_machines "$NUM_MACHINES" \
    --num_processes "$NUM_PROCESSES" --main_process_ip "$MAIN_PROCESS_IP" --main_process_port "$MAIN_PROCESS_PORT" \
    --rdzv_backend static --same_network
  printf -- '--machine_rank %s ' "$1"
  printf '%q ' "$SCRIPT" --config "$RECIPE" ${BATCH_ARGS[@]+"${BATCH_ARGS[@]}"} ${VLLM_ARGS[@]+"${VLLM_ARGS[@]}"} \
    ${EXTRA[@]+"${EXTRA[@]}"}
}
NODELIST=$(IFS=,; echo "${TRAIN_NODES[*]}")
SRUN=(srun --nodes="$NUM_MACHINES" --ntasks="$NUM_MACHINES" --ntasks-per-node=1 --nodelist="$NODELIST"
      --kill-on-bad-exit=1)
TRAIN_CMD=$(launch_command '$SLURM_PROCID')

echo "trl-variants: $RECIPE on $NUM_MACHINES node(s) x $GPUS_PER_NODE = $NUM_PROCESSES processes, $ACCELERATE_CONFIG, rendezvous $MAIN_PROCESS_IP:$MAIN_PROCESS_PORT"
[[ -z "$BATCH_NOTE" ]] || echo "trl-variants: $BATCH_NOTE"
if [[ "$VLLM_NODES" == 1 ]]; then
  echo "trl-variants: vLLM server on $VLLM_NODE:$VLLM_PORT (vllm_mode=server)"
elif [[ "$USES_VLLM" == true ]]; then
  echo "trl-variants: vLLM as the recipe sets it (colocate: one engine per training process)"
fi

if [[ "$DRY_RUN" == 1 ]]; then
  [[ "$VLLM_NODES" == 0 ]] || echo "vllm: srun --nodes=1 --ntasks=1 --nodelist=$VLLM_NODE $(printf '%q ' "${SERVE_CMD[@]}")&"
  echo "train: $(printf '%q ' "${SRUN[@]}")bash -c $(printf '%q' "$TRAIN_CMD")"
  for rank in "${!TRAIN_NODES[@]}"; do
    echo "node $rank (${TRAIN_NODES[$rank]}): $(launch_command "$rank")"
  done
  exit 0
fi

VLLM_PID=
if [[ "$VLLM_NODES" == 1 ]]; then
  srun --nodes=1 --ntasks=1 --nodelist="$VLLM_NODE" "${SERVE_CMD[@]}" &
  VLLM_PID=$!
fi
# A SIGTERM to this script (`#SBATCH --signal=B:TERM@<seconds>`: preemption, the time limit) goes to the training
# step only, which srun passes to its tasks; a vLLM server keeps serving the step under way until training ends.
"${SRUN[@]}" bash -c "$TRAIN_CMD" &
TRAIN_PID=$!
trap 'kill -TERM "$TRAIN_PID" 2>/dev/null' TERM
status=0
while :; do
  wait "$TRAIN_PID" && { status=0; break; } || status=$?
  kill -0 "$TRAIN_PID" 2>/dev/null || break  # it ended (a trapped signal only interrupts the wait)
done
trap - TERM
[[ -z "$VLLM_PID" ]] || kill "$VLLM_PID" 2>/dev/null || true
exit "$status"
