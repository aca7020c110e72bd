"""Step-time ratios of each trainer to its TRL baseline on the tiny default and on a real model, side by side.

    python benchmarks/real_vs_tiny.py        # reads results/benchmarks/benchmarks.json and benchmarks_smollm2.json

Both files are written by ``benchmarks/bench_trainers.py`` (their commands are in results/benchmarks/README.md and in
each file's ``settings``); this script only puts their ratios in one table: ``results/benchmarks/real_vs_tiny.md``.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results" / "benchmarks"
LABELS = {"erpo": "ERPO / GRPO(beta=0)", "eepo": "EEPO / GRPO(beta=0)", "dph": "DPH-RL / GRPO(beta=0)",
          "parts_off": "no part / GRPO(beta=0)", "apo": "A*-PO / GRPO(G=2), per prompt"}


def ratios(path: Path) -> tuple[dict, dict]:
    data = json.loads(path.read_text())
    summary = dict(data["summary"])
    out = {}
    for variant, s in summary.items():
        base = s.get("baseline")
        if not base:
            continue
        if variant == "apo":  # A*-PO samples one completion per prompt: compared per training prompt
            out[variant] = s["time_per_prompt_s"] / summary[base]["time_per_prompt_s"]
        else:
            out[variant] = s["step_time_ratio"]
    return out, data["settings"]


def main() -> None:
    tiny, tiny_settings = ratios(RESULTS / "benchmarks.json")
    real, real_settings = ratios(RESULTS / "benchmarks_smollm2.json")
    lines = ["# Step-time ratios: tiny default vs a real model (SmolLM2-135M-Instruct)", "",
             "Written by `python benchmarks/real_vs_tiny.py` from the two runs below (medians of interleaved "
             "repetitions; each row's ratio is to its TRL baseline in the same run).", "",
             "| ratio | tiny default (1M parameters, 2k vocabulary) | SmolLM2-135M (49k vocabulary) |",
             "|---|---|---|"]
    for variant, label in LABELS.items():
        if variant in tiny or variant in real:
            cell = [f"{d[variant]:.3f}x" if variant in d else "not run" for d in (tiny, real)]
            lines.append(f"| {label} | {cell[0]} | {cell[1]} |")
    for name, settings in (("tiny", tiny_settings), ("SmolLM2", real_settings)):
        lines.append("")
        lines.append(f"{name}: `{json.dumps(settings)}`")
    (RESULTS / "real_vs_tiny.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
