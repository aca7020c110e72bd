#!/usr/bin/env bash
# How long the README's test command takes on a clean clone, as CI runs it: results/test_suite/{run.json,pytest_tail.log}
#   bash benchmarks/time_suite.sh            # clones HEAD into a scratch folder, runs CI=true bash .ci/run there
# It then regenerates the README's front page (benchmarks/front_page.py), which quotes run.json: commit both,
# or trainers_tests/test_front_page.py fails on the stale block.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
out=results/test_suite
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
git clone -q "$repo" "$scratch/clone"
commit=$(git -C "$scratch/clone" rev-parse --short HEAD)
start=$(date +%s.%N)
status=0
(cd "$scratch/clone" && CI=true bash .ci/run) > "$scratch/log" 2>&1 || status=$?
end=$(date +%s.%N)
mkdir -p "$out"
tail -n 90 "$scratch/log" > "$out/pytest_tail.log"
python3 - "$out" "$start" "$end" "$commit" "$status" <<'PY'
import json, os, re, sys
out, start, end, commit, status = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
tail = open(f"{out}/pytest_tail.log").read()
count = lambda word: int((re.findall(rf"(\d+) {word}", tail) or [0])[-1])
json.dump({"command": "CI=true bash .ci/run (a clean clone)", "commit": commit, "exit_status": status,
           "wall_seconds": round(end - start, 1), "cpu_cores": os.cpu_count(), "passed": count("passed"),
           "failed": count("failed"), "skipped": count("skipped")}, open(f"{out}/run.json", "w"), indent=1)
PY
cat "$out/run.json"
if [ -x .venv/bin/python ]; then
    .venv/bin/python benchmarks/front_page.py || echo "time_suite: front_page.py failed: run it, then commit README.md"
else
    echo "time_suite: no .venv here: run python benchmarks/front_page.py in an environment, then commit README.md"
fi
exit $status
