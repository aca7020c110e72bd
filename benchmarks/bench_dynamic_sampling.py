"""DAPO's dynamic sampling against plain GRPO on the embedded default: what a useful group costs, and where the
model ends after the same number of optimizer steps.

    python benchmarks/bench_dynamic_sampling.py                      # results/benchmarks/dynamic_sampling.{json,md}
    python benchmarks/bench_dynamic_sampling.py --seeds 0 --steps 10 --out /tmp/ds   # a quick look

Both runs train TRL's GRPO from the shipped tiny model with the same prompts, seed, batch (32 completions = 4
prompts x 8), learning rate and steps: ``GRPOTrainer`` itself, and ``ComposedTrainer(parts=["dapo_dynamic_sampling"])``
(GRPO plus dynamic sampling, at most ``--max_rounds`` generation rounds per batch). Seeds alternate the two.

Per run: completion tokens generated (every round), wall time of ``train()``, *useful groups* trained (groups whose
rewards are not all equal, so GRPO's advantage is not zero: GRPO's ``1 - frac_reward_zero_std`` of each batch;
dynamic sampling's filled places), hence tokens and seconds per useful group; generation rounds per batch; the time
dynamic sampling spends per round outside sampling and scoring (choosing groups and moving rows: its overhead); and
greedy held-out accuracy after training (``--eval_prompts`` prompts never trained on). Mean +- 95% CI over seeds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from replicate import fmt, mean_ci  # noqa: E402  (the replication's statistics: mean +- 95% CI, Student t)

VARIANTS = ("grpo", "dynamic_sampling")


def _count_generated(trainer, counter: dict) -> None:
    """Count the completion tokens of every generate call (all rounds)."""
    generate = trainer._generate

    def counted(prompts):
        out = generate(prompts)
        counter["tokens"] += sum(len(ids) for ids in out[1])
        return out

    trainer._generate = counted


def _time_overhead(trainer, counter: dict) -> None:
    """Time dynamic sampling spends in ``fill`` outside its rounds (sampling + scoring), per round."""
    part = trainer.part("dapo_dynamic_sampling")
    fill = part.fill

    def timed_fill(trainer_, inputs, rollout):
        inside = {"s": 0.0}

        def timed_rollout(x):
            t0 = time.perf_counter()
            out = rollout(x)
            inside["s"] += time.perf_counter() - t0
            return out

        t0 = time.perf_counter()
        result = fill(trainer_, inputs, timed_rollout)
        counter["overhead_s"] += time.perf_counter() - t0 - inside["s"]
        return result

    part.fill = timed_fill


def run(variant: str, seed: int, args) -> dict:
    from trl import GRPOConfig, GRPOTrainer

    from trl_variants import ComposedConfig, ComposedTrainer, accuracy_reward, load_default_dataset
    from trl_variants.default import DEFAULT_MODEL_PATH

    out_dir = Path(args.work_dir) / f"{variant}-seed{seed}"
    common = dict(output_dir=str(out_dir), use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none",
                  save_strategy="no", logging_steps=1, disable_tqdm=True, seed=seed, per_device_train_batch_size=32,
                  num_generations=8, max_completion_length=args.max_len, temperature=1.0, learning_rate=args.lr,
                  lr_scheduler_type="constant", max_steps=args.steps)
    data = load_default_dataset(n_train=args.train_prompts, n_test=0, seed=seed)["train"]
    if variant == "grpo":
        trainer = GRPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, args=GRPOConfig(**common),
                              train_dataset=data)
    else:
        config = ComposedConfig(parts=["dapo_dynamic_sampling"], dynamic_sampling_max_rounds=args.max_rounds,
                                **common)
        trainer = ComposedTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, args=config,
                                  train_dataset=data)
    counter = {"tokens": 0, "overhead_s": 0.0}
    _count_generated(trainer, counter)
    if variant != "grpo":
        _time_overhead(trainer, counter)
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    trainer.save_model(str(out_dir))
    steps = [h for h in trainer.state.log_history if "reward" in h]
    groups = common["per_device_train_batch_size"] // common["num_generations"]
    if variant == "grpo":
        useful = sum(groups * (1 - h["frac_reward_zero_std"]) for h in steps)
        rounds = float(len(steps))
    else:
        useful = sum(groups - h["dynamic_sampling/unfilled_groups"] for h in steps)
        rounds = sum(h["dynamic_sampling/rounds"] for h in steps)
    return {"variant": variant, "seed": seed, "train_s": train_s, "generated_tokens": counter["tokens"],
            "useful_groups": useful, "groups": groups * len(steps), "rounds": rounds, "steps": len(steps),
            "overhead_s": counter["overhead_s"], "model_dir": str(out_dir)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max_len", type=int, default=64)
    ap.add_argument("--max_rounds", type=int, default=4)
    ap.add_argument("--train_prompts", type=int, default=1000)
    ap.add_argument("--eval_prompts", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "results" / "benchmarks"))
    ap.add_argument("--work_dir", default=str(ROOT / "outputs" / "bench_dynamic_sampling"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from trl_variants import accuracy_reward, load_default_dataset
    from trl_variants.evaluation import EvalConfig, evaluate

    test = load_default_dataset(n_train=0, n_test=args.eval_prompts)["test"]
    eval_config = EvalConfig(k=1, temperatures=[1.0], max_completion_length=args.max_len, compute_entropy=False,
                             show_progress=False)
    runs = []
    for seed in args.seeds:
        for variant in (VARIANTS if seed % 2 == 0 else VARIANTS[::-1]):  # alternate which runs first
            r = run(variant, seed, args)
            r["heldout_greedy"] = evaluate(r["model_dir"], None, test, accuracy_reward, eval_config)["greedy"]
            runs.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "model_dir"}), flush=True)

    def per(variant, key):
        return [r[key] for r in runs if r["variant"] == variant]

    rows = {}
    for v in VARIANTS:
        rows[v] = {
            "wall s": mean_ci(per(v, "train_s")),
            "generated tokens": mean_ci(per(v, "generated_tokens")),
            "useful groups (of groups trained)": mean_ci(per(v, "useful_groups")),
            "tokens per useful group": mean_ci([t / max(u, 1e-9) for t, u in
                                                zip(per(v, "generated_tokens"), per(v, "useful_groups"), strict=True)]),
            "seconds per useful group": mean_ci([t / max(u, 1e-9) for t, u in
                                                 zip(per(v, "train_s"), per(v, "useful_groups"), strict=True)]),
            "generation rounds per batch": mean_ci([r / s for r, s in zip(per(v, "rounds"), per(v, "steps"),
                                                                          strict=True)]),
            "held-out greedy accuracy": mean_ci(per(v, "heldout_greedy")),
        }
    overhead = mean_ci([o / r * 1000 for o, r in zip(per("dynamic_sampling", "overhead_s"),
                                                     per("dynamic_sampling", "rounds"), strict=True)])
    cmd = "python benchmarks/bench_dynamic_sampling.py " + " ".join(argv if argv is not None else sys.argv[1:])
    groups = runs[0]["groups"]
    lines = [
        "# Dynamic sampling (DAPO) vs GRPO on the embedded default", "",
        f"Command: `{cmd.strip()}` ({len(args.seeds)} seeds, {args.steps} optimizer steps of 4 prompts x 8 "
        f"completions = {groups} groups per run, at most {args.max_rounds} generation rounds per batch, "
        f"{args.eval_prompts} held-out prompts; mean +- 95% CI over seeds; {args.threads} threads).", "",
        "| | GRPOTrainer | GRPO + dynamic sampling |", "|---|---|---|",
    ]
    for key in rows["grpo"]:
        lines.append(f"| {key} | {fmt(rows['grpo'][key])} | {fmt(rows['dynamic_sampling'][key])} |")
    lines += ["", f"Dynamic sampling's own time per generation round (choosing groups, moving and padding rows; "
              f"sampling and scoring excluded): {fmt(overhead)} ms.", "",
              "A useful group is one whose rewards are not all equal (non-zero GRPO advantage). Wall time is "
              "`trainer.train()` only (model loading excluded)."]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dynamic_sampling.md").write_text("\n".join(lines) + "\n")
    (out / "dynamic_sampling.json").write_text(json.dumps({"command": cmd, "runs": runs, "summary": {
        v: {k: list(x) for k, x in r.items()} for v, r in rows.items()}, "overhead_ms_per_round": list(overhead)},
        indent=1, default=str))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
