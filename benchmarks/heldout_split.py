"""The hard held-out split for DPH-RL's and EEPO's claims, chosen from the base model's behaviour alone.

    python benchmarks/heldout_split.py            # results/heldout_split/ (README.md, split.json, PNG)

DPH-RL's claim is that it keeps the pass@k that GRPO loses; EEPO's that exploration lasts longer. On the standard
held-out split GRPO loses almost no pass@16 (the base solves 99% of the prompts within 16 samples), so there is
nothing to keep. The issue asks for a split where the base solves problems only sometimes, and a larger k.

The rule, fixed before any trained model was evaluated on it (the page this script writes says the same):

1. Candidates: the standard held-out split (``load_default_dataset``'s test split, seed 999, the first
   ``--eval_prompts`` = 500 prompts; every training set here skips them), so the split stays held out for every run.
   Levels beyond training (5 and 6, ``BEYOND_LEVELS``) are measured too, as the issue suggests, for information
   only: a level-5 chain does not fit the 64-token completion step by step, so what the base solves there is
   guessed sums, not the premise (a first draft made them candidates if solved at all; changed when the base's
   samples showed a few guesses right, before any trained model was evaluated).
2. The base samples ``--k`` = 64 completions per prompt at T = 1 (the training temperature), completion length 64
   (the replication's), with a **selection seed (1) different from the evaluation seed (0)**: the prompts are chosen
   on one set of samples and measured on another, so the base's numbers on the split are not biased down by the
   choice (regression to the mean).
3. A prompt is *hard* when the base's success rate on it is at most ``--max_rate`` = 0.25 (solved in at most one
   sample of four): solvable only sometimes, where a policy that narrows its sampling loses pass@k first.
4. k = 64 on the split (pass@64 and avg@64), 5 seeds, as every other number of the replication.

Writes ``--out``: ``split.json`` (the indices of the hard prompts in the test split, the rule, the rates),
``README.md`` (the base's pass rates by level and the split's make-up), ``base_rates.png``.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SELECTION_SEED = 1  # the replication evaluates with seed 0: the split is chosen on other samples


def beyond_levels_dataset(prompts: int):
    """``prompts`` problems of each level beyond training (``BEYOND_LEVELS``), their own seeded draw (never in any
    training set); shared with ``probe_beyond_levels.py``."""
    from trl_variants.default import problems_to_dataset
    from trl_variants.default.task import BEYOND_LEVELS, generate_problem

    rng = random.Random(5)
    return problems_to_dataset([generate_problem(rng, lv) for lv in BEYOND_LEVELS for _ in range(prompts)])


def level_rows(levels, rates: list[float], ks: list[int], k: int) -> list[dict]:
    """Per level: prompts, mean success rate (avg@k) and pass@j for each j of ``ks`` (from ``k`` samples)."""
    from trl_variants.evaluation import pass_at_k

    rows = []
    for level in sorted(set(levels)):
        r = [x for x, lv in zip(rates, levels, strict=True) if lv == level]
        n = len(r)
        rows.append({"level": level, "prompts": n, "avg": sum(r) / n,
                     **{f"pass@{j}": sum(pass_at_k(k, round(x * k), j) for x in r) / n for j in ks}})
    return rows


def hard_indices(rates: list[float], levels: list[int], max_rate: float, candidate_levels) -> list[int]:
    """The rule (module docstring, 3): indices whose base success rate is <= ``max_rate``, on candidate levels."""
    return [i for i, (x, lv) in enumerate(zip(rates, levels, strict=True)) if x <= max_rate and lv in candidate_levels]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eval_prompts", type=int, default=500)
    ap.add_argument("--beyond_prompts", type=int, default=50, help="prompts per level beyond training (5, 6)")
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--max_rate", type=float, default=0.25)
    ap.add_argument("--max_len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "results" / "heldout_split"))
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from datasets import concatenate_datasets

    from trl_variants import accuracy_reward, load_default_dataset
    from trl_variants.default import DEFAULT_MODEL_PATH
    from trl_variants.default.task import LEVELS
    from trl_variants.evaluation import EvalConfig, evaluate, ks_up_to

    test = load_default_dataset(n_train=0, n_test=args.eval_prompts)["test"]
    beyond = beyond_levels_dataset(args.beyond_prompts)
    data = concatenate_datasets([test, beyond])
    config = EvalConfig(k=args.k, temperatures=[1.0], greedy=False, max_completion_length=args.max_len,
                        seed=SELECTION_SEED, compute_entropy=False)
    out = Path(args.out)
    result = evaluate(DEFAULT_MODEL_PATH, None, data, accuracy_reward, config, name="base (selection samples)",
                      results_file=out / "chunks" / "base.jsonl")  # a rerun reads the samples' counts back
    correct = result["temperatures"]["1.0"]["correct"]
    rates = [c / args.k for c in correct]
    levels = list(data["level"])
    ks = [j for j in ks_up_to(args.k) if j in (1, 4, 16, 64) or j == args.k]
    rows = level_rows(levels, rates, ks, args.k)
    hard = [i for i in hard_indices(rates, levels, args.max_rate, LEVELS) if i < len(test)]  # rule 1: the test split
    split = {
        "rule": {"candidates": f"the first {args.eval_prompts} prompts of the test split (seed 999)",
                 "eval_prompts": args.eval_prompts,
                 "k": args.k, "temperature": 1.0, "max_completion_length": args.max_len,
                 "selection_seed": SELECTION_SEED, "max_rate": args.max_rate},
        "indices": hard, "levels": [levels[i] for i in hard], "base_selection_rates": [rates[i] for i in hard],
        "by_level": rows,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "split.json").write_text(json.dumps(split, indent=1))
    plot_rates(rates, levels, args.max_rate, out / "base_rates.png")
    page = write_page(out, args, split, rows, ks, len(test))
    print(page)
    return split


def plot_rates(rates, levels, max_rate, path) -> None:
    from trl_variants.evaluation import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for level in sorted(set(levels)):
        r = sorted(x for x, lv in zip(rates, levels, strict=True) if lv == level)
        ax.plot([i / max(len(r) - 1, 1) for i in range(len(r))], r, label=f"level {level} ({len(r)} prompts)")
    ax.axhline(max_rate, color="0.3", ls="--", lw=1)
    ax.text(0.99, max_rate + 0.02, f"hard: rate <= {max_rate}", fontsize=8, ha="right")
    ax.set_xlabel("prompts of the level, sorted by the base's success rate")
    ax.set_ylabel("base success rate (T = 1)")
    ax.set_title("The base model's per-prompt success rate, by level (selection samples)", fontsize=9)
    ax.legend(fontsize=7, loc="center left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_page(out: Path, args, split: dict, rows: list[dict], ks: list[int], n_test: int) -> str:
    hard_levels = split["levels"]
    lines = [
        "# The hard held-out split (DPH-RL's and EEPO's claims)",
        "",
        "Made by `python benchmarks/heldout_split.py` (sampling the base: about 4 minutes on 2 cores; a rerun reads "
        "the samples' counts back from `chunks/`). Chosen from the base model's samples alone, before any "
        "trained model was evaluated on it; the rule is in `benchmarks/heldout_split.py` and below.",
        "",
        "## The rule",
        "",
        f"- Candidates: the {n_test} prompts of the standard held-out split (every training set skips them).",
        f"- The base samples {args.k} completions per prompt at T = 1, completion length {args.max_len}, with a "
        f"selection seed ({SELECTION_SEED}) other than the evaluation's (0): chosen on one set of samples, measured "
        "on another.",
        f"- Hard: the base's success rate on the prompt is <= {args.max_rate}. The claims are then read with "
        f"k = {args.k} on these prompts.",
        "",
        "## The base's pass rates by level (selection samples)",
        "",
        "| level | prompts | avg@1 (success rate) | " + " | ".join(f"pass@{j}" for j in ks) + " | hard prompts |",
        "|---|---|---|" + "---|" * len(ks) + "---|",
    ]
    for r in rows:
        n_hard = hard_levels.count(r["level"])
        lines.append(f"| {r['level']} | {r['prompts']} | {r['avg']:.3f} | "
                     + " | ".join(f"{r[f'pass@{j}']:.3f}" for j in ks) + f" | {n_hard} |")
    lines += [
        "",
        f"Levels 5 and 6 (longer chains than any in training, {args.beyond_prompts} prompts each) are shown for "
        f"information and are not candidates: a level-5 chain does not fit {args.max_len} tokens step by step, so the "
        "base's successes there (pass@" + f"{args.k} " + ", ".join(f"{r[f'pass@{args.k}']:.3f}" for r in rows
                                                           if r["level"] > 4)
        + ") are guessed sums, not the reasoning a method could keep or lose. (A first draft of the rule made them "
        "candidates if solved at all; changed when these samples showed a few guesses right, before any trained "
        "model was evaluated.)",
        "",
        f"**The split: {len(split['indices'])} prompts** (levels "
        + ", ".join(f"{lv}: {hard_levels.count(lv)}" for lv in sorted(set(hard_levels)))
        + f"), base success rate on the selection samples {sum(split['base_selection_rates']) / max(len(hard_levels), 1):.3f}"
        " on average. Indices in `split.json`.",
        "",
        "![base rates](base_rates.png)",
        "",
    ]
    text = "\n".join(lines)
    (out / "README.md").write_text(text)
    return text


if __name__ == "__main__":
    main()
