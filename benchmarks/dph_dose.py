"""DPH-RL's mechanism, dose-response: the rehearsal strength eta against what it should protect.

    python benchmarks/dph_dose.py                      # eta 0, 0.02, 0.2, 2.0 x seeds 5 6 7 -> results/dph_dose/

On the shifted split of ``replicate.py`` (train on levels 1-2, read the held-out levels 3-4: where GRPO's pass@k
falls below the base's), DPH-RL is trained with the rehearsal coefficient ``dph_coef`` (eta; the paper's 0.2 for JS)
at 0 (the same split, D_exp trained with GRPO's loss and nothing rehearsed) and at values 10x below and above, with
everything else as in ``replicate.py`` (its ``train``: same data per seed, same settings, same offline-pass cache).
Each model is read on three prompt sets, at T = 1:

* the rehearsed prompts themselves: D_pef, the training prompts the reference solved at least ``pef_threshold`` of
  ``num_presamples`` times (up to ``--pef_prompts`` of them, the same ones for every eta of a seed), pass@k and avg@k;
* the held-out prompts of the training levels (1-2), pass@k and avg@k;
* the held-out prompts of the other levels (3-4), pass@``--k_heldout`` (the claim's k) and avg@k;

and the rehearsal loss (``dph/loss_pef``: the token mean of f(u) on D_pef batches) over training is kept from each
run's log. The shipped model (the base) is read on the same sets. Each finished (eta, seed) is saved under
``--work_dir`` and reused when rerun with the same settings; a run of eta = 0.2 with a seed of the confirmatory
DPH-RL study (``--reuse_dir``, same settings) is read from there instead of trained again.

Writes ``--out``: ``dose.json`` (every number per seed, the settings), ``README.md`` (mean ± 95% CI over seeds per
eta and prompt set, the rehearsal loss), ``dose.png`` (pass@k against eta for the three sets, with the base; the
rehearsal loss over training per eta).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import replicate  # noqa: E402  (benchmarks/replicate.py: the shared training and statistics)

ROOT = Path(__file__).resolve().parent.parent


def study_args(args) -> argparse.Namespace:
    """``replicate.py``'s arguments for the shifted split with this study's training settings."""
    return argparse.Namespace(steps=args.steps, lr=1e-4, G=8, max_len=64, train_prompts=args.train_prompts,
                              eval_prompts=500, k=args.k_heldout, temperatures=[1.0], logging_steps=10,
                              threads=args.threads, base_model=args.base_model, split="test", split_file=None,
                              train_levels=[1, 2], eval_levels=[3, 4], entropy_every=0, entropy_prompts=100,
                              apo_batch=32, apo_shard_size=64, lazy_value_pass=False)


def training_levels_heldout(rargs):
    """The held-out prompts of the training levels (1-2): the standard held-out split of those levels."""
    from trl_variants import load_default_dataset

    test = load_default_dataset(n_train=0, n_test=rargs.eval_prompts)["test"]
    return test.filter(lambda level: level in rargs.train_levels, input_columns="level")


def pef_prompts(seed: int, rargs, limit: int):
    """The seed's D_pef prompts (``prompt`` and ``solution``; each prompt once, however many of its completions are
    kept) and their number, as DPH-RL's offline split makes it: the trainer is built (the pass is read from the cache
    ``replicate.train`` fills), nothing is trained."""
    from trl_variants import DPHConfig, DPHTrainer, accuracy_reward, load_default_dataset

    data = load_default_dataset(n_train=rargs.train_prompts, n_test=rargs.eval_prompts, seed=seed,
                                levels=tuple(rargs.train_levels))["train"]
    config = DPHConfig(**replicate.shared_settings(rargs, seed, ROOT / "outputs" / "dph_dose" / "split"),
                       presample_cache_dir=str(ROOT / "outputs" / "replication-cache"))
    trainer = DPHTrainer(model=rargs.base_model, reward_funcs=accuracy_reward, args=config, train_dataset=data)
    pef = getattr(trainer, "pef_dataset", None)
    if pef is None:  # the split held by the rehearsal part itself
        pef = next(p.pef_dataset for p in trainer.parts if hasattr(p, "pef_dataset"))
    indices = sorted(set(pef["prompt_index"]))  # rows of the presampled training set: D_pef's prompts
    prompts = data.select(indices).select_columns(["prompt", "solution"])
    return prompts.select(range(min(limit, len(prompts)))), len(prompts)


def read(model_dir: str, sets: dict, args, name: str) -> dict:
    """avg@k and pass@k of one model on each prompt set at T = 1."""
    from trl_variants import accuracy_reward
    from trl_variants.evaluation import EvalConfig, evaluate

    out = {}
    for key, (dataset, k) in sets.items():
        config = EvalConfig(k=k, temperatures=[1.0], greedy=False, max_completion_length=64, seed=0,
                            show_progress=False)
        ev = evaluate(model_dir, None, dataset, accuracy_reward, config, name=f"{name}-{key}")
        t = ev["temperatures"]["1.0"]
        out[key] = {"prompts": len(dataset), "k": k, f"pass@{k}": t["pass@k"][str(k)] if str(k) in t["pass@k"]
                    else t["pass@k"][k], f"avg@{k}": t[f"avg@{k}"]}
    return out


def rehearsal_curve(history: list[dict]) -> list[list[float]]:
    return [[h["step"], h["dph/loss_pef"]] for h in history if "dph/loss_pef" in h]


def run_one(eta: float, seed: int, rargs, args, sets: dict) -> dict:
    """Train (or reuse) DPH-RL with ``dph_coef=eta`` on ``seed`` and read it on the prompt sets."""
    work = Path(args.work_dir) / f"eta{eta:g}-seed{seed}"
    record_path = work / "dose.json"
    settings = {**replicate.run_settings(rargs), "dph_coef": eta, "pef_prompts": args.pef_prompts,
                "k_sets": args.k_sets, "k_heldout": args.k_heldout}
    if record_path.exists() and (saved := json.loads(record_path.read_text()))["settings"] == settings:
        print(f"eta {eta:g} seed {seed}: reusing {record_path}", flush=True)
        return saved
    reused = Path(args.reuse_dir) / f"dph-seed{seed}" if args.reuse_dir else None
    t0 = time.perf_counter()
    if eta == 0.2 and reused is not None and replicate.saved_training(reused / "run.json", rargs) is not None:
        run, model_dir = json.loads((reused / "run.json").read_text())["run"], str(reused)
        print(f"eta 0.2 seed {seed}: the confirmatory study's model ({reused})", flush=True)
    else:
        run = replicate.train("dph", seed, rargs, work, extra={"dph_coef": eta})
        model_dir = str(work)
    record = {"settings": settings, "eta": eta, "seed": seed, "model_dir": model_dir,
              "train_s": run["train_s"], "rehearsal_loss": rehearsal_curve(run["history"]),
              "sets": read(model_dir, sets, args, f"eta{eta:g}-s{seed}"), "seconds": time.perf_counter() - t0}
    work.mkdir(parents=True, exist_ok=True)
    record_path.write_text(json.dumps(record))
    print(f"eta {eta:g} seed {seed}: " + ", ".join(f"{k} {v[next(iter(x for x in v if x.startswith('pass@')))]:.3f}"
                                                    for k, v in record["sets"].items()), flush=True)
    return record


def summary(records: list[dict], base: dict[int, dict], etas: list[float]) -> dict:
    """Mean ± 95% CI over seeds of each (eta, set, metric), and the base's."""
    out = {}
    for eta in etas:
        mine = [r for r in records if r["eta"] == eta]
        out[f"{eta:g}"] = {key: {metric: replicate.mean_ci([r["sets"][key][metric] for r in mine])
                                 for metric in mine[0]["sets"][key] if metric.startswith(("pass@", "avg@"))}
                           for key in mine[0]["sets"]}
        last = [r["rehearsal_loss"][-1][1] for r in mine if r["rehearsal_loss"]]
        out[f"{eta:g}"]["rehearsal_loss_last"] = replicate.mean_ci(last) if last else None
    seeds = sorted(base)
    out["base"] = {key: {metric: replicate.mean_ci([base[s][key][metric] for s in seeds])
                         for metric in base[seeds[0]][key] if metric.startswith(("pass@", "avg@"))}
                   for key in base[seeds[0]]}
    return out


SET_TITLES = {"pef": "rehearsed prompts (D_pef)", "train_levels": "held-out, training levels 1-2",
              "heldout_levels": "held-out, levels 3-4"}


def plot(stats: dict, records: list[dict], etas: list[float], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: dose.png skipped (the numbers are in dose.json)")
        return
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    xs = list(range(len(etas)))
    for ax, key in zip(axes[:3], SET_TITLES, strict=True):
        metric = next(m for m in stats[f"{etas[0]:g}"][key] if m.startswith("pass@"))
        means = [stats[f"{e:g}"][key][metric][0] for e in etas]
        halves = [stats[f"{e:g}"][key][metric][1] for e in etas]
        ax.errorbar(xs, means, yerr=halves, marker="o", capsize=4, label="DPH-RL")
        for e_i, e in enumerate(etas):
            ax.scatter([e_i] * len([r for r in records if r["eta"] == e]),
                       [r["sets"][key][metric] for r in records if r["eta"] == e], color="grey", s=10, zorder=3)
        ax.axhline(stats["base"][key][metric][0], color="black", linestyle="--", label="base")
        ax.set_xticks(xs, [f"{e:g}" for e in etas])
        ax.set_xlabel("eta (dph_coef)")
        ax.set_title(f"{metric}: {SET_TITLES[key]}", fontsize=9)
        ax.legend(fontsize=8)
    for e in etas:
        curves = [r["rehearsal_loss"] for r in records if r["eta"] == e and r["rehearsal_loss"]]
        if curves:
            steps = [s for s, _ in curves[0]]
            mean = [sum(c[i][1] for c in curves) / len(curves) for i in range(len(steps))]
            axes[3].plot(steps, mean, label=f"eta {e:g}")
    axes[3].set_xlabel("step")
    axes[3].set_title("rehearsal loss dph/loss_pef (mean over seeds)", fontsize=9)
    axes[3].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_page(out: Path, stats: dict, records: list[dict], etas: list[float], args, pef_sizes: dict) -> None:
    fmt = replicate.fmt
    keys = list(SET_TITLES)
    metrics = {key: [m for m in stats[f"{etas[0]:g}"][key]] for key in keys}
    head = "| eta | " + " | ".join(f"{SET_TITLES[k]}: {m}" for k in keys for m in metrics[k]) + " | rehearsal loss, last log |"
    lines = ["# DPH-RL dose-response: the rehearsal strength against what it should protect", "",
             f"Made by `python benchmarks/dph_dose.py {' '.join(sys.argv[1:])}`".rstrip() + " (the script's docstring says "
             "what each number is). Shifted split: trained on levels 1-2, read at T = 1; "
             f"seeds {args.seeds}, {args.steps} steps, mean ± 95% CI over seeds. D_pef sizes per seed (all of it; "
             f"up to {args.pef_prompts} read): {pef_sizes}.", "", head,
             "|" + "---|" * (2 + sum(len(v) for v in metrics.values()))]
    lines.append("| base | " + " | ".join(fmt(stats["base"][k][m]) for k in keys for m in metrics[k]) + " | |")
    for e in etas:
        s = stats[f"{e:g}"]
        loss = fmt(s["rehearsal_loss_last"], 4) if s["rehearsal_loss_last"] else "-"
        lines.append(f"| {e:g} | " + " | ".join(fmt(s[k][m]) for k in keys for m in metrics[k]) + f" | {loss} |")
    lines += ["", "![pass@k against eta, and the rehearsal loss](dose.png)", "",
              "What it shows, and why: docs/RESULTS.md, section 4b, \"DPH-RL dose-response\".", ""]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--etas", type=float, nargs="+", default=[0.0, 0.02, 0.2, 2.0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[5, 6, 7])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--train_prompts", type=int, default=2000)
    ap.add_argument("--pef_prompts", type=int, default=200, help="D_pef prompts read per seed (the first N)")
    ap.add_argument("--k_sets", type=int, default=16, help="k on the rehearsed prompts and the training levels")
    ap.add_argument("--k_heldout", type=int, default=64, help="k on the held-out levels 3-4 (the claim's k)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--base_model", default=None)
    ap.add_argument("--work_dir", default=str(ROOT / "outputs" / "dph_dose"))
    ap.add_argument("--reuse_dir", default=str(ROOT / "outputs" / "replication_narrow_confirm"),
                    help="a replicate.py work dir whose dph-seed<n> models (eta 0.2, same settings) are reused")
    ap.add_argument("--out", default=str(ROOT / "results" / "dph_dose"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from trl_variants.default import DEFAULT_MODEL_PATH

    args.base_model = str(args.base_model or DEFAULT_MODEL_PATH)
    rargs = study_args(args)
    heldout = replicate.heldout_split(rargs)
    train_levels = training_levels_heldout(rargs)
    records, base, pef_sizes = [], {}, {}
    for seed in args.seeds:
        pef, pef_sizes[seed] = pef_prompts(seed, rargs, args.pef_prompts)
        sets = {"pef": (pef, args.k_sets), "train_levels": (train_levels, args.k_sets),
                "heldout_levels": (heldout, args.k_heldout)}
        base_path = Path(args.work_dir) / f"base-seed{seed}.json"
        base_settings = {"pef_prompts": args.pef_prompts, "k_sets": args.k_sets, "k_heldout": args.k_heldout,
                         "base_model": args.base_model, **replicate.run_settings(rargs)}
        if base_path.exists() and json.loads(base_path.read_text())["settings"] == base_settings:
            base[seed] = json.loads(base_path.read_text())["sets"]
        else:
            base[seed] = read(args.base_model, sets, args, f"base-s{seed}")
            base_path.parent.mkdir(parents=True, exist_ok=True)
            base_path.write_text(json.dumps({"settings": base_settings, "sets": base[seed]}))
        for eta in args.etas:
            records.append(run_one(eta, seed, rargs, args, sets))
    stats = summary(records, base, args.etas)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dose.json").write_text(json.dumps({"settings": vars(args) | {"base_model": "the shipped model"},
                                               "pef_sizes": pef_sizes, "stats": stats, "base": base,
                                               "runs": records}, indent=1, default=str))
    plot(stats, records, args.etas, out / "dose.png")
    write_page(out, stats, records, args.etas, args, pef_sizes)
    print((out / "README.md").read_text())
    return stats


if __name__ == "__main__":
    main()
