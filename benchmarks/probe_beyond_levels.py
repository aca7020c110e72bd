"""DPH-RL's premise beyond the training levels: does the base keep a step-by-step mode that RL-trained models lose?

    python benchmarks/probe_beyond_levels.py        # results/probe_beyond_levels/ (README.md, results.json)

The hard split (``heldout_split.py``) did not show GRPO losing pass@k: every method turns to short direct answers and
makes them accurate. The idea tried here (docs/RESULTS.md 4b): at levels the training never drew (5 and 6: sums
of 6 and 7 numbers, ``BEYOND_LEVELS``), a direct answer is a guess, while a step-by-step chain, if it fits the completion, could still
be right; a policy narrowed to direct answers would then lose the pass@k the base keeps. The completion budget is
raised to 128 tokens (the replication's 64 cannot hold a level-5 chain). The base is compared with the GRPO and
DPH-RL models of the hard-split study (seed 0: a probe, not a claim; run that study first).

One probe, read once; no claim table. Samples are cached per model (``chunks/``): a rerun reads them back.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def by_level(levels: list[int], correct: list[int], k: int) -> dict:
    """pass@k (share of prompts solved at least once in k samples) and the mean success rate, per level."""
    out = {}
    for level in sorted(set(levels)):
        idx = [i for i, lv in enumerate(levels) if lv == level]
        out[str(level)] = {"prompts": len(idx), f"pass@{k}": sum(correct[i] > 0 for i in idx) / len(idx),
                           "success_rate": sum(correct[i] for i in idx) / (k * len(idx))}
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=50, help="prompts per level beyond training (5, 6)")
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--max_len", type=int, default=128)
    ap.add_argument("--work_dir", default=str(ROOT / "outputs" / "replication_hard_split"),
                    help="the hard-split study's runs (grpo-seed0, dph-seed0)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "results" / "probe_beyond_levels"))
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded from its path (tests)
    from heldout_split import beyond_levels_dataset  # the same draw as the split's page measured

    from trl_variants import accuracy_reward
    from trl_variants.default import DEFAULT_MODEL_PATH
    from trl_variants.default.task import BEYOND_LEVELS
    from trl_variants.evaluation import EvalConfig, evaluate

    data = beyond_levels_dataset(args.prompts)
    levels = list(data["level"])
    models = {"base": DEFAULT_MODEL_PATH, "GRPO (TRL), seed 0": Path(args.work_dir) / "grpo-seed0",
              "DPH-RL, seed 0": Path(args.work_dir) / "dph-seed0"}
    tags = dict(zip(models, ["base", "grpo", "dph"], strict=True))  # the cached samples' file names
    for path in models.values():
        if not Path(path).exists():
            raise SystemExit(f"{path} does not exist: run the hard-split study first (benchmarks/run_all.sh)")
    out = Path(args.out)
    results = {}
    for name, path in models.items():
        config = EvalConfig(k=args.k, temperatures=[1.0], greedy=True, max_completion_length=args.max_len, seed=0,
                            compute_entropy=False)
        r = evaluate(str(path), None, data, accuracy_reward, config, name=name,
                     results_file=out / "chunks" / f"{tags[name]}.jsonl")
        t = r["temperatures"]["1.0"]
        results[name] = {"mean_length": t["mean_length"], "levels": by_level(levels, t["correct"], args.k)}
    out.mkdir(parents=True, exist_ok=True)
    record = {"settings": vars(args), "results": results}
    (out / "results.json").write_text(json.dumps(record, indent=1))
    rows = [f"| {name} | {r['mean_length']:.1f} | "
            + " | ".join(f"{r['levels'][str(lv)][f'pass@{args.k}']:.2f} / {r['levels'][str(lv)]['success_rate']:.4f}"
                         for lv in BEYOND_LEVELS) + " |" for name, r in results.items()]
    page = "\n".join([
        "# Probe: DPH-RL's premise beyond the training levels",
        "",
        f"Made by `python benchmarks/probe_beyond_levels.py` ({args.prompts} prompts per level, k = {args.k}, T = 1, "
        f"completion length {args.max_len}, evaluation seed 0). Why and what it shows: docs/RESULTS.md section 4b.",
        "",
        "| model | mean completion length (tokens) | "
        + " | ".join(f"level {lv}: pass@{args.k} / success rate" for lv in BEYOND_LEVELS) + " |",
        "|---|---|" + "---|" * len(BEYOND_LEVELS),
        *rows,
        "",
    ])
    (out / "README.md").write_text(page)
    print(page)
    return record


if __name__ == "__main__":
    main()
