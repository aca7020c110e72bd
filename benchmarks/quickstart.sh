#!/usr/bin/env bash
# The README's first command, run as a user runs it, its output kept for the front page: results/quickstart/
#   bash benchmarks/quickstart.sh            # writes results/quickstart/{train_erpo.log,heldout.json,heldout_curves.png,run.json}
# TRL_VARIANTS=<command> picks the CLI (default: .venv/bin/trl-variants, else trl-variants on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/quickstart
cli=${TRL_VARIANTS:-$( [ -x .venv/bin/trl-variants ] && echo .venv/bin/trl-variants || echo trl-variants )}
mkdir -p "$out" outputs   # outputs/: the run's own folder and its stderr (absent in a fresh clone)
start=$(date +%s.%N)
HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 "$cli" train erpo > "$out/train_erpo.log" 2> outputs/quickstart_stderr.log
end=$(date +%s.%N)
cp outputs/erpo-tiny/heldout.json outputs/erpo-tiny/heldout_curves.png "$out/"
python3 - "$out" "$start" "$end" <<'PY'
import json, os, platform, sys
out, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
json.dump({"command": "trl-variants train erpo", "wall_seconds": round(end - start, 1), "cpu_cores": os.cpu_count(),
           "platform": platform.platform()}, open(f"{out}/run.json", "w"), indent=1)
PY
tail -n 5 "$out/train_erpo.log"
