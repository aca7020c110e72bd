"""The report of an evaluation: ``results.json``, a Markdown table, and the plots (accuracy against temperature,
pass@k against k, the held-out curves of training); without matplotlib the plots are skipped with a note."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

PLOTS_SKIPPED = ("plots skipped: matplotlib is not installed (pip install 'trl-variants[plots]'); the numbers are "
                 "in {where}")
"""The note printed instead of the plots when matplotlib is missing (the numbers are written all the same)."""


def have_matplotlib() -> bool:
    """Whether matplotlib imports (the plots need it; the JSON and Markdown results do not)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only, no display); raises ImportError naming the extra
    without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("plots need matplotlib: pip install 'trl-variants[plots]'") from e
    return plt


def plot_temperature_sweep(all_results: Sequence[dict], path) -> None:
    """Accuracy (avg@k, pass@1, pass@k) against sampling temperature, one line style per metric, one colour per
    model; greedy accuracy as a dotted horizontal line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, res in enumerate(all_results):
        color = f"C{i}"
        temps = sorted(float(t) for t in res["temperatures"])
        k = res["config"]["k"]
        avg = [res["temperatures"][str(t)][f"avg@{k}"] for t in temps]
        pk = [res["temperatures"][str(t)]["pass@k"][str(k)] for t in temps]
        ax.plot(temps, avg, "-o", color=color, label=f"{res['name']} avg@{k}")
        ax.plot(temps, pk, "--s", color=color, label=f"{res['name']} pass@{k}")
        if "greedy" in res:
            ax.axhline(res["greedy"], color=color, ls=":", lw=1, label=f"{res['name']} greedy")
    ax.set_xlabel("sampling temperature")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("Accuracy vs sampling temperature")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_pass_at_k(all_results: Sequence[dict], path, temperature: float | None = None) -> None:
    """pass@k against k on a log2 axis, one line per model (at ``temperature``, default the highest swept)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for i, res in enumerate(all_results):
        t = temperature if temperature is not None else max(float(x) for x in res["temperatures"])
        curve = res["temperatures"][str(t)]["pass@k"]
        ks = sorted(int(k) for k in curve)
        ax.plot(ks, [curve[str(k)] for k in ks], "-o", color=f"C{i}", label=f"{res['name']} (T={t})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title("pass@k")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown_table(all_results: Sequence[dict]) -> str:
    lines = ["| model | T | greedy | avg@k | pass@1 | pass@k | entropy | mean length | KL to ref | keep | explore |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in all_results:
        k = res["config"]["k"]
        for t, e in sorted(res["temperatures"].items(), key=lambda kv: float(kv[0])):
            def fmt(key, d=e):
                v = d.get(key)
                return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"

            lines.append(f"| {res['name']} | {t} | {fmt('greedy', res)} | {e[f'avg@{k}']:.3f} | "
                         f"{e['pass@k']['1']:.3f} | {e['pass@k'][str(k)]:.3f} | {fmt('entropy')} | "
                         f"{e['mean_length']:.1f} | {fmt('kl_to_reference')} | {fmt('keep_rate')} | "
                         f"{fmt('exploration_rate')} |")
    rules = sorted({res["correctness_func"] for res in all_results if "correctness_func" in res})
    if rules:
        lines += ["", f"A sample is correct when {' / '.join(rules)} > 0 (the other reward functions never count)."]
    means = [(res["name"], "greedy", res["greedy_reward_means"]) for res in all_results
             if "greedy_reward_means" in res]
    means += [(res["name"], t, e["reward_means"]) for res in all_results
              for t, e in sorted(res["temperatures"].items(), key=lambda kv: float(kv[0])) if "reward_means" in e]
    if means and any(len(m) > 1 for _, _, m in means):
        funcs = list(dict.fromkeys(f for _, _, m in means for f in m))
        lines += ["", "Mean reward per function:", "", "| model | T | " + " | ".join(funcs) + " |",
                  "|---|---|" + "---|" * len(funcs)]
        lines += [f"| {model} | {t} | " + " | ".join(f"{m[f]:.3f}" if f in m else "" for f in funcs) + " |"
                  for model, t, m in means]
    return "\n".join(lines) + "\n"


def write_report(all_results: Sequence[dict], output_dir) -> dict[str, str]:
    """Write ``results.json``, ``results.md``, ``accuracy_vs_temperature.png`` and ``pass_at_k.png``; without
    matplotlib the plots are skipped with a one-line note (:data:`PLOTS_SKIPPED`) and only the numbers are written.
    Returns the paths written."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "markdown": out / "results.md",
             "temperature_plot": out / "accuracy_vs_temperature.png", "pass_at_k_plot": out / "pass_at_k.png"}
    paths["json"].write_text(json.dumps(list(all_results), indent=1))
    paths["markdown"].write_text(markdown_table(all_results))
    if not have_matplotlib():
        print(PLOTS_SKIPPED.format(where=f"{paths['json']} and {paths['markdown']}"), flush=True)
        return {k: str(paths[k]) for k in ("json", "markdown")}
    plot_temperature_sweep(all_results, paths["temperature_plot"])
    plot_pass_at_k(all_results, paths["pass_at_k_plot"])
    return {k: str(v) for k, v in paths.items()}


def plot_heldout_curves(record: dict, path) -> None:
    """Training reward (left) and held-out greedy / avg@k accuracy (right) against the optimizer step."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    if record["train_reward"]:
        steps, rewards = zip(*record["train_reward"], strict=True)
        left.plot(steps, rewards, "-", color="C0")
    left.set(xlabel="step", ylabel="mean reward of the rollouts", title="Training reward", ylim=(0, 1))
    k = record["k"]
    steps = [h["step"] for h in record["history"]]
    right.plot(steps, [h["greedy"] for h in record["history"]], "-o", color="C1", label="greedy")
    right.plot(steps, [h[f"avg@{k}"] for h in record["history"]], "-s", color="C2",
               label=f"avg@{k} (T={record['temperature']:g})")
    right.set(xlabel="step", ylabel="accuracy", ylim=(0, 1),
              title=f"Held-out accuracy ({record['num_prompts']} prompts)")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
