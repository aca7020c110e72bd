"""Evaluation as the four papers do it: greedy accuracy, avg@k and pass@k swept over sampling temperatures, token
entropy, response length, optional KL to a reference, and keep / exploration rates against a base model
(DPH-RL Sec. 6.1). Outputs a JSON file with every number (per-prompt correctness counts included), a Markdown
table and PNG plots.

>>> from trl_variants.evaluate import EvalConfig, evaluate, write_report
>>> results = evaluate("outputs/erpo-tiny", None, load_default_dataset()["test"], config=EvalConfig(k=8))
>>> write_report([results], "eval/")

Sampling goes through the shared offline pass (:func:`trl_variants.presample.presample`), so it is batched, seeded
per shard (identical with 1 or N processes) and sharded across processes under ``accelerate launch``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import TrainerCallback

from ._validation import ensure_pad_token
from .presample import PresampleConfig, presample, token_logps
from .presample.logprobs import left_pad
from .rewards import accuracy_reward

__all__ = ["EvalConfig", "HeldOutCallback", "PassAtKCallback", "evaluate", "keep_and_exploration_rates", "pass_at_k", "plot_pass_at_k",
           "plot_temperature_sweep", "write_report"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al. 2021) from ``n`` samples with ``c`` correct, in its numerically stable
    product form ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def ks_up_to(k: int) -> list[int]:
    """1, 2, 4, ... up to k, and k itself."""
    out, v = [], 1
    while v < k:
        out.append(v)
        v *= 2
    return out + [k]


def keep_and_exploration_rates(base_solved: Sequence[bool], new_solved: Sequence[bool]) -> dict[str, float]:
    """DPH-RL Sec. 6.1: of the prompts the base model solved (any of its k samples correct), the fraction the new
    model still solves (keep rate); of those it did not, the fraction the new model now solves (exploration rate)."""
    if len(base_solved) != len(new_solved):
        raise ValueError(f"base has {len(base_solved)} prompts, new has {len(new_solved)}: evaluate the same prompts")
    kept = [n for b, n in zip(base_solved, new_solved, strict=True) if b]
    found = [n for b, n in zip(base_solved, new_solved, strict=True) if not b]
    return {"keep_rate": sum(kept) / len(kept) if kept else float("nan"),
            "exploration_rate": sum(found) / len(found) if found else float("nan"),
            "num_base_solved": len(kept), "num_base_unsolved": len(found)}


@dataclass
class EvalConfig:
    """Options of :func:`evaluate`.

    Parameters:
        k: samples per prompt at each temperature (avg@k, pass@k' for every k' <= k).
        temperatures: sampling temperatures to sweep (ERPO sweeps 0.1-1.5).
        greedy: also measure greedy accuracy.
        top_p, max_completion_length: sampling options.
        compute_entropy: mean token entropy of the sampled completions (one scoring forward pass).
        seed: base seed (each temperature and shard derives its own).
        generation_batch_size, logprob_batch_size: sequences per generate call / per scoring forward.
    """

    k: int = field(default=8, metadata={"help": "Samples per prompt at each temperature (avg@k, pass@k' for k' <= k)."})
    temperatures: list[float] = field(
        default_factory=lambda: [0.6, 1.0], metadata={"help": "Sampling temperatures to sweep (ERPO sweeps 0.1-1.5)."}
    )
    greedy: bool = field(default=True, metadata={"help": "Also measure greedy accuracy."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling threshold in (0, 1] (1 = off)."})
    max_completion_length: int = field(default=64, metadata={"help": "Maximum new tokens per completion."})
    compute_entropy: bool = field(
        default=True, metadata={"help": "Mean token entropy of the sampled completions (one scoring forward pass)."}
    )
    seed: int = field(default=0, metadata={"help": "Base seed (each temperature and shard derives its own)."})
    generation_batch_size: int = field(default=128, metadata={"help": "Sequences per generate call."})
    logprob_batch_size: int = field(default=32, metadata={"help": "Sequences per scoring forward pass."})

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if not self.temperatures or any(not t > 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be a non-empty list of values > 0, got {self.temperatures}")


def _sample(model, tokenizer, dataset, reward_funcs, config: EvalConfig, temperature, greedy, accelerator):
    cfg = PresampleConfig(
        num_samples=1 if greedy else config.k, greedy=greedy, temperature=temperature, top_p=config.top_p,
        max_completion_length=config.max_completion_length, record_prompt_logp=False, use_cache=False,
        seed=config.seed + int(round(temperature * 1000)), generation_batch_size=config.generation_batch_size,
        show_progress=False,
    )
    columns = [c for c in dataset.column_names if not c.startswith("ref_")]
    return presample(model, tokenizer, dataset.select_columns(columns), reward_funcs, cfg, accelerator=accelerator)


def _completion_stats(model, sampled, temperature, config, ref_model=None):
    """Mean token entropy of the sampled completions and (with ``ref_model``) the mean sequence log-ratio."""
    rows = [(p, c) for p, cs in zip(sampled["ref_prompt_ids"], sampled["ref_completion_ids"], strict=True) for c in cs]
    ent_sum, tok, kl_sum = 0.0, 0, 0.0
    pad = 0
    for start in range(0, len(rows), config.logprob_batch_size):
        chunk = rows[start : start + config.logprob_batch_size]
        ids, mask = left_pad([p + c for p, c in chunk], pad)
        # completion positions: the last len(c) columns of the (B, L - 1) score matrix
        cmask = torch.zeros(ids.size(0), ids.size(1) - 1)
        for i, (_, c) in enumerate(chunk):
            if c:
                cmask[i, -len(c):] = 1
        logps, ent = token_logps(model, ids, mask, temperature, config.logprob_batch_size, with_entropy=True)
        ent_sum += (ent * cmask).sum().item()
        tok += int(cmask.sum().item())
        if ref_model is not None:
            ref = token_logps(ref_model, ids, mask, temperature, config.logprob_batch_size)
            kl_sum += ((logps - ref) * cmask).sum().item()
    out = {"entropy": ent_sum / max(tok, 1)}
    if ref_model is not None:
        out["kl_to_reference"] = kl_sum / max(len(rows), 1)  # MC estimate of KL(pi || pi_ref) per sequence
    return out


def evaluate(
    model,
    tokenizer,
    dataset,
    reward_funcs: Callable | Sequence[Callable] = accuracy_reward,
    config: EvalConfig | None = None,
    *,
    name: str | None = None,
    reference_model=None,
    base_results: dict | None = None,
    accelerator=None,
) -> dict:
    """Evaluate one model on ``dataset`` (``prompt`` + the columns the rewards read, e.g. ``solution``).

    ``model`` / ``reference_model``: a path or Hub id, or a model object (then ``tokenizer`` is required).
    ``base_results``: the result dict of the base model on the same prompts: adds keep / exploration rates.
    Returns a dict: ``name``, ``config``, ``greedy`` accuracy, and per temperature ``avg@k``, ``pass@k'``,
    ``entropy``, ``mean_length``, ``kl_to_reference`` (if asked), the per-prompt ``correct`` counts, and keep /
    exploration rates (if ``base_results``).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = config or EvalConfig()
    if isinstance(model, str | Path):
        name = name or Path(str(model)).name
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(model), padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(str(model))
    if isinstance(reference_model, str | Path):
        reference_model = AutoModelForCausalLM.from_pretrained(str(reference_model))
    if tokenizer is None:
        raise ValueError("tokenizer is required when model is a model object")
    ensure_pad_token(tokenizer)  # as GRPOTrainer: no pad token (Llama 3, Mistral) pads with EOS
    device = accelerator.device if accelerator is not None else next(model.parameters()).device
    model = model.to(device)
    if reference_model is not None:
        reference_model = reference_model.to(device)
    results: dict = {"name": name or getattr(model.config, "_name_or_path", "model"), "config": asdict(config),
                     "num_prompts": len(dataset), "temperatures": {}}
    if config.greedy:
        greedy = _sample(model, tokenizer, dataset, reward_funcs, config, 1.0, True, accelerator)
        results["greedy"] = sum(r[0] > 0 for r in greedy["ref_rewards"]) / len(greedy)
    for t in config.temperatures:
        sampled = _sample(model, tokenizer, dataset, reward_funcs, config, t, False, accelerator)
        correct = [sum(r > 0 for r in rs) for rs in sampled["ref_rewards"]]
        n = config.k
        entry = {
            f"avg@{n}": sum(correct) / (n * len(correct)),
            "pass@k": {str(kk): sum(pass_at_k(n, c, kk) for c in correct) / len(correct) for kk in ks_up_to(n)},
            "mean_length": sum(len(c) for cs in sampled["ref_completion_ids"] for c in cs) / (n * len(correct)),
            "correct": correct,
        }
        if "level" in dataset.column_names:
            levels = dataset["level"]
            entry["avg_by_level"] = {str(lv): sum(c for c, l_ in zip(correct, levels, strict=True) if l_ == lv)
                                     / (n * sum(1 for l_ in levels if l_ == lv)) for lv in sorted(set(levels))}
        if config.compute_entropy or reference_model is not None:
            entry.update(_completion_stats(model, sampled, t, config, reference_model))
        if base_results is not None:
            base = base_results["temperatures"].get(str(t))
            if base is None:
                raise ValueError(f"base_results has no temperature {t}: evaluate the base at the same temperatures")
            entry.update(keep_and_exploration_rates([c > 0 for c in base["correct"]], [c > 0 for c in correct]))
        results["temperatures"][str(t)] = entry
    return results


# ------------------------------------------------------------------------------------------------- reports ---
def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("plots need matplotlib: pip install 'trl-variants[plots]'") from e
    return plt


def plot_temperature_sweep(all_results: Sequence[dict], path) -> None:
    """Accuracy (avg@k, pass@1, pass@k) against sampling temperature, one line style per metric, one colour per
    model; greedy accuracy as a dotted horizontal line."""
    plt = _plt()
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
    plt = _plt()
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
    return "\n".join(lines) + "\n"


def write_report(all_results: Sequence[dict], output_dir) -> dict[str, str]:
    """Write ``results.json``, ``results.md``, ``accuracy_vs_temperature.png`` and ``pass_at_k.png``."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "markdown": out / "results.md",
             "temperature_plot": out / "accuracy_vs_temperature.png", "pass_at_k_plot": out / "pass_at_k.png"}
    paths["json"].write_text(json.dumps(list(all_results), indent=1))
    paths["markdown"].write_text(markdown_table(all_results))
    plot_temperature_sweep(all_results, paths["temperature_plot"])
    plot_pass_at_k(all_results, paths["pass_at_k_plot"])
    return {k: str(v) for k, v in paths.items()}


# ------------------------------------------------------------------------------------- training callback ---
def evaluate_policy(trainer, dataset, reward_funcs, config: EvalConfig) -> dict:
    """:func:`evaluate` on a trainer's current policy (sharded over its processes when there are several), leaving
    the model in the train / eval mode it was in. Every process must call it."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    was_training = model.training
    multi = trainer.accelerator.num_processes > 1
    res = evaluate(model, trainer.processing_class, dataset, reward_funcs, config,
                   accelerator=trainer.accelerator if multi else None)
    model.train(was_training)
    return res


class PassAtKCallback(TrainerCallback):
    """Run :func:`evaluate` on ``dataset`` every ``eval_steps`` optimizer steps and log the numbers through the
    trainer's logging (``eval_passk/greedy``, ``eval_passk/T<t>/avg@k``, ``.../pass@k``, ``.../entropy``).

    >>> trainer.add_callback(PassAtKCallback(trainer, load_default_dataset()["test"], EvalConfig(k=4), 50))
    """

    def __init__(self, trainer, dataset, config: EvalConfig | None = None, eval_steps: int = 50,
                 reward_funcs=accuracy_reward):
        if eval_steps < 1:
            raise ValueError(f"eval_steps must be >= 1, got {eval_steps}")
        self.trainer, self.dataset, self.config = trainer, dataset, config or EvalConfig(k=4)
        self.eval_steps, self.reward_funcs = eval_steps, reward_funcs

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.eval_steps:
            return
        trainer = self.trainer
        res = evaluate_policy(trainer, self.dataset, self.reward_funcs, self.config)
        k = self.config.k
        logs = {"eval_passk/greedy": res["greedy"]} if "greedy" in res else {}
        for t, e in res["temperatures"].items():
            logs[f"eval_passk/T{t}/avg@{k}"] = e[f"avg@{k}"]
            logs[f"eval_passk/T{t}/pass@{k}"] = e["pass@k"][str(k)]
            if "entropy" in e:
                logs[f"eval_passk/T{t}/entropy"] = e["entropy"]
        trainer.log(logs)


class HeldOutCallback(TrainerCallback):
    """Held-out accuracy before training (the base), every ``eval_steps`` optimizer steps and after the last step:
    greedy accuracy and avg@k at the trainer's sampling temperature, logged through the trainer as
    ``heldout/greedy`` and ``heldout/avg@k``. When training ends it prints base vs trained and writes
    ``<output_dir>/heldout.json`` and ``<output_dir>/heldout_curves.png`` (training reward and held-out accuracy
    against the step). Every process must take part (the sampling is sharded).

    >>> trainer.add_callback(HeldOutCallback(trainer, load_default_dataset()["test"], k=4, eval_steps=50))
    """

    def __init__(self, trainer, dataset, k: int = 4, eval_steps: int = 50, reward_funcs=accuracy_reward,
                 max_completion_length: int | None = None, plot: bool = True):
        if eval_steps < 1:
            raise ValueError(f"eval_steps must be >= 1, got {eval_steps}")
        args = trainer.args
        self.trainer, self.dataset, self.eval_steps, self.reward_funcs, self.plot = (
            trainer, dataset, eval_steps, reward_funcs, plot)
        self.temperature = args.temperature
        self.config = EvalConfig(k=k, temperatures=[args.temperature], top_p=args.top_p, compute_entropy=False,
                                 max_completion_length=max_completion_length or args.max_completion_length,
                                 seed=args.seed)
        if plot:
            _plt()  # before training: a missing matplotlib fails now, not after the run
        self.history: list[dict] = []

    def _measure(self, step: int) -> None:
        if self.history and self.history[-1]["step"] == step:
            return
        trainer = self.trainer
        res = evaluate_policy(trainer, self.dataset, self.reward_funcs, self.config)
        k, t = self.config.k, str(self.temperature)
        row = {"step": step, "greedy": res["greedy"], f"avg@{k}": res["temperatures"][t][f"avg@{k}"]}
        self.history.append(row)
        trainer.log({f"heldout/{key}": v for key, v in row.items() if key != "step"})

    def on_train_begin(self, args, state, control, **kwargs):
        self._measure(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.eval_steps == 0:
            self._measure(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self._measure(state.global_step)
        if not state.is_world_process_zero:
            return
        base, last, k = self.history[0], self.history[-1], self.config.k
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        rewards = [(e["step"], e["reward"]) for e in state.log_history if "reward" in e]
        record = {"num_prompts": len(self.dataset), "temperature": self.temperature, "k": k,
                  "history": self.history, "train_reward": rewards}
        (out / "heldout.json").write_text(json.dumps(record, indent=1))
        lines = [f"held-out accuracy on {len(self.dataset)} prompts never trained on (base -> step {last['step']}):"]
        for key, label in (("greedy", "greedy"), (f"avg@{k}", f"avg@{k} (T={self.temperature:g})")):
            lines.append(f"  {label:<16} {base[key]:.3f} -> {last[key]:.3f} ({100 * (last[key] - base[key]):+.1f} "
                         "points)")
        if self.plot:
            plot_heldout_curves(record, out / "heldout_curves.png")
            lines.append(f"  curves: {out / 'heldout_curves.png'}")
        print("\n".join(lines), flush=True)


def plot_heldout_curves(record: dict, path) -> None:
    """Training reward (left) and held-out greedy / avg@k accuracy (right) against the optimizer step."""
    plt = _plt()
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
