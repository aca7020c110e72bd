"""Small-scale replication of the four papers' headline claims on the embedded default (CPU, offline).

    python benchmarks/replicate.py                     # 2 seeds, 150 steps each, ~30-40 min on 2 cores
    python benchmarks/replicate.py --seeds 0 --steps 60  # quick look
    python benchmarks/replicate.py --methods grpo erpo --base_model outputs/tiny-prompt-trained \
        --out docs/replication_prompt_trained          # ERPO's Query-KL claim on a base that learned its prompts

Every method trains from the shipped tiny model with the same step budget, learning rate, batch (32 completions per
step), completion length and seed; nothing is tuned for one method only. A*-PO samples one completion per prompt,
so with the same 32 completions per step it sees 32 prompts per step (the same number of generated sequences).
Then every final model and the base are evaluated with ``trl_variants.evaluate`` on the fixed test split.
Writes ``docs/replication/``: ``results.json``, ``results.md`` (the claims, measured), training curves and the
evaluation plots.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
METHODS = ["grpo", "erpo", "eepo", "dph", "apo"]


def train(method: str, seed: int, args, out_dir: Path):
    from trl import GRPOConfig, GRPOTrainer

    from trl_variants import (
        APOConfig,
        APOTrainer,
        DPHConfig,
        DPHTrainer,
        EEPOConfig,
        EEPOTrainer,
        ERPOConfig,
        ERPOTrainer,
        accuracy_reward,
        load_default_dataset,
    )
    common = dict(output_dir=str(out_dir), use_cpu=True, bf16=False, activation_checkpointing=False,
                  report_to="none", save_strategy="no", logging_steps=5, disable_tqdm=True, seed=seed,
                  per_device_train_batch_size=32, num_generations=8, max_completion_length=56, temperature=1.0,
                  learning_rate=args.lr, lr_scheduler_type="constant", max_steps=args.steps)
    data = load_default_dataset(n_train=args.train_prompts, n_test=1, seed=seed)["train"]
    cache = str(ROOT / "outputs" / "replication-cache")
    cls, cfg = {
        "grpo": (GRPOTrainer, lambda: GRPOConfig(**common)),
        "erpo": (ERPOTrainer, lambda: ERPOConfig(**common)),
        "eepo": (EEPOTrainer, lambda: EEPOConfig(**common)),
        "dph": (DPHTrainer, lambda: DPHConfig(presample_cache_dir=cache, pef_batch_size=4, **common)),
        "apo": (APOTrainer, lambda: APOConfig(presample_cache_dir=cache, **{**common, "num_generations": 1})),
    }[method]
    t0 = time.perf_counter()
    trainer = cls(model=args.base_model, reward_funcs=accuracy_reward, args=cfg(), train_dataset=data)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    trainer.save_model(str(out_dir))
    return {"history": trainer.state.log_history, "setup_s": setup, "train_s": train_s}


def query_kl(model_path: str, base_path: str, prompts) -> float:
    """Mean k3 Query-KL of a model's prompt log-likelihoods against the base model's (ERPO's quantity)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_variants.erpo.reference import reference_prompt_logps
    from trl_variants.losses import query_kl as k3

    tok = AutoTokenizer.from_pretrained(base_path)
    base = AutoModelForCausalLM.from_pretrained(base_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    l_ref = torch.tensor(reference_prompt_logps(base, tok, prompts))
    l_theta = torch.tensor(reference_prompt_logps(model, tok, prompts))
    return k3(l_theta, l_ref).mean().item()


def curves(runs: dict, path: Path) -> None:
    from trl_variants.evaluate import _plt

    plt = _plt()
    # a panel reads the first of its keys a log entry has: GRPO's token-level `kl` (beta > 0), A*-PO's sequence-level
    # log-ratio to the reference on its rollouts (an MC estimate of KL(pi || pi_ref) per completion)
    keys = [(("reward",), "train reward"), (("entropy",), "token entropy"),
            (("kl", "apo/seq_log_ratio_mean"), "KL to reference (GRPO beta>0: per token; A*-PO: per sequence)"),
            (("erpo/query_kl",), "Query-KL (ERPO)")]
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.4))
    for ax, (key, title) in zip(axes, keys, strict=True):
        for i, (method, seeds) in enumerate(runs.items()):
            for j, run in enumerate(seeds):
                pts = [(h["step"], next(h[k] for k in key if k in h)) for h in run["history"]
                       if any(k in h for k in key)]
                if pts:
                    ax.plot(*zip(*pts, strict=True), color=f"C{i}", alpha=0.9 if j == 0 else 0.4,
                            label=method if j == 0 else None)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--lr", type=float, default=1.5e-4)
    ap.add_argument("--train_prompts", type=int, default=512)
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--eval_prompts", type=int, default=200)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.5, 1.0, 1.5])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "docs" / "replication"))
    ap.add_argument("--base_model", default=None, help="start every method from this model (default: the shipped one)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from trl_variants import accuracy_reward, load_default_dataset
    from trl_variants.default import DEFAULT_MODEL_PATH
    from trl_variants.evaluate import EvalConfig, evaluate, write_report

    args.base_model = str(args.base_model or DEFAULT_MODEL_PATH)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list] = {m: [] for m in args.methods}
    for seed in args.seeds:
        for method in args.methods:
            model_dir = ROOT / "outputs" / Path(args.out).name / f"{method}-seed{seed}"
            runs[method].append(train(method, seed, args, model_dir) | {"model_dir": str(model_dir)})
            r = runs[method][-1]
            print(f"trained {method} seed {seed}: {r['train_s']:.0f} s (+{r['setup_s']:.0f} s setup)", flush=True)
    curves(runs, out / "training_curves.png")

    test = load_default_dataset(n_train=0, n_test=args.eval_prompts)["test"]
    config = EvalConfig(k=args.k, temperatures=args.temperatures, max_completion_length=56, seed=0)
    base = evaluate(args.base_model, None, test, accuracy_reward, config, name="base")
    evals = {"base": [base]}
    for method, seeds in runs.items():
        evals[method] = []
        for seed, run in zip(args.seeds, seeds, strict=True):
            res = evaluate(run["model_dir"], None, test, accuracy_reward, config, name=f"{method}-s{seed}",
                           reference_model=args.base_model, base_results=base)
            res["query_kl"] = query_kl(run["model_dir"], args.base_model, list(test["prompt"]))
            res["train_s"], res["setup_s"] = run["train_s"], run["setup_s"]
            evals[method].append(res)
            print(f"evaluated {method} seed {seed}", flush=True)
    write_report([base] + [evals[m][0] for m in args.methods], out)

    def mean(method, fn):
        vals = [fn(r) for r in evals[method]]
        return statistics.mean(vals), (statistics.stdev(vals) if len(vals) > 1 else float("nan"))

    k, t_hi = args.k, str(max(args.temperatures))
    def e(r, t="1.0"):
        return r["temperatures"][t]

    rows = {}
    for method in ["base"] + args.methods:
        rows[method] = {
            "greedy": mean(method, lambda r: r["greedy"]),
            f"avg@{k} T=1.0": mean(method, lambda r: e(r)[f"avg@{k}"]),
            f"pass@{k} T=1.0": mean(method, lambda r: e(r)["pass@k"][str(k)]),
            f"avg@{k} T={t_hi}": mean(method, lambda r: e(r, t_hi)[f"avg@{k}"]),
            "entropy T=1.0": mean(method, lambda r: e(r)["entropy"]),
            "KL to base": mean(method, lambda r: e(r).get("kl_to_reference", 0.0)),
            "keep rate": mean(method, lambda r: e(r).get("keep_rate", float("nan"))),
            "query-KL": mean(method, lambda r: r.get("query_kl", 0.0)),
            "train s": mean(method, lambda r: r.get("train_s", 0.0)),
        }
    cols = list(rows["base"])
    lines = [f"Settings: {vars(args)}", "", "| method | " + " | ".join(cols) + " |",
             "|---|" + "---|" * len(cols)]
    for method, r in rows.items():
        cells = [f"{m:.3f}" + ("" if math.isnan(s) else f" ± {s:.3f}") for m, s in r.values()]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    Path(out / "summary.md").write_text("\n".join(lines) + "\n")
    Path(out / "replication.json").write_text(json.dumps(
        {"settings": vars(args), "summary": {m: {c: list(v) for c, v in r.items()} for m, r in rows.items()},
         "evaluations": evals, "histories": {m: [r["history"] for r in s] for m, s in runs.items()}}, indent=1,
        default=str))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
