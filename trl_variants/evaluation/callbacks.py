"""Evaluation during training: :class:`PassAtKCallback` (pass@k sweep every N steps) and :class:`HeldOutCallback`
(held-out accuracy before, during and after training: what ``heldout_eval_steps`` of the example scripts adds)."""

from __future__ import annotations

import collections
import json
from dataclasses import replace
from pathlib import Path

from transformers import TrainerCallback

from .._model import check_whole_policy_for_generation, params_sharded, whole_policy_for_generation
from ..presample.random_state import preserved_random_state
from ..presample.vllm_backend import trainer_generator, trainer_hf_generator
from ..rewards import accuracy_reward
from .config import BACKENDS, VLLM_EXTRA, EvalConfig
from .metrics import correctness_index
from .report import PLOTS_SKIPPED, have_matplotlib, plot_heldout_curves
from .runner import evaluate


def stopped_by_signal(trainer) -> bool:
    """Whether a SIGTERM stopped the trainer's training at this step (``enable_jit_checkpoint``): then the
    evaluations are skipped, the grace the cluster gives being for the checkpoint."""
    return getattr(trainer, "stopped_by_signal", None) is not None


def callback_config(trainer, config: EvalConfig, backend: str = "hf") -> EvalConfig:
    """``config`` as a training callback runs it: the progress bar off when the trainer's ``disable_tqdm`` is set,
    with ``backend="hf"`` the trainer's ``use_transformers_continuous_batching`` / ``cache_implementation`` (unless
    ``config`` sets its own), and ``backend`` checked: ``"vllm"`` samples with the trainer's own vLLM engine, so it
    needs ``use_vllm=True`` (and is refused under ZeRO-3 / FSDP). Under ZeRO-3 / FSDP the evaluation holds the full
    weights on every process: refused under FSDP1 and with ``ds3_gather_for_generation=False``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if params_sharded(trainer):
        if backend == "vllm":
            raise ValueError(
                "held-out evaluation during training with backend='vllm' is not supported under DeepSpeed ZeRO-3 or "
                "FSDP (untested there: vLLM does not run on the machines this project is tested on): use "
                "backend='hf', which samples with the full weights gathered on every process, or evaluate the saved "
                "checkpoints with `trl-variants evaluate --backend vllm`")
        check_whole_policy_for_generation(trainer, "held-out evaluation during training")
    if backend == "vllm" and not getattr(trainer, "use_vllm", False):
        raise ValueError("backend='vllm' evaluates with the trainer's own vLLM engine (its current weights pushed "
                         "into it), and this trainer has none: set use_vllm=True in its config (vllm_mode "
                         f"'colocate' or 'server'; {VLLM_EXTRA}), or use backend='hf'")
    engine = {}
    hf = trainer_hf_generator(trainer) if backend == "hf" else None  # generate as the trainer does
    own = any(getattr(config, k) != default for k, default in EvalConfig._HF_ENGINE_DEFAULTS.items())
    if hf is not None and not own:  # unless the config sets an engine itself
        engine = dict(use_transformers_continuous_batching=hf.continuous_batching,
                      transformers_continuous_batching_config=hf.continuous_batching_config,
                      cache_implementation=hf.cache_implementation)
    return replace(config, backend=backend, show_progress=config.show_progress and not trainer.args.disable_tqdm,
                   **engine)


def evaluate_policy(trainer, dataset, reward_funcs, config: EvalConfig, name: str | None = None) -> dict:
    """:func:`evaluate` on a trainer's current policy (its chunks shared between its processes when there are
    several), leaving the model in the train / eval mode it was in and the random state as it was (training draws
    the same numbers with or without evaluations). Every process must call it. Under DeepSpeed ZeRO-3 or FSDP2 each
    process holds the full weights while it evaluates (:func:`~trl_variants._model.whole_policy_for_generation`).
    ``config.backend="vllm"``: sampled by the trainer's vLLM engine
    (:func:`~trl_variants.presample.vllm_backend.trainer_generator`), scored as with ``"hf"``."""
    multi = trainer.accelerator.num_processes > 1
    generator = trainer_generator(trainer) if config.backend == "vllm" else None
    # ZeRO-3 / FSDP2: the full weights on every process for the evaluation, each process sampling its own chunks
    with whole_policy_for_generation(trainer) as model, preserved_random_state():  # sampling seeds torch: training's
        was_training = model.training  # own draws must not depend on whether it evaluates
        try:
            return evaluate(model, trainer.processing_class, dataset, reward_funcs, config, name=name,
                            accelerator=trainer.accelerator if multi else None, generator=generator)
        finally:
            model.train(was_training)


def log_apart(trainer, logs: dict, control=None) -> None:
    """``trainer.log(logs)`` as an entry of its own that takes nothing from the step's own log. GRPOTrainer's ``log``
    adds (and clears) the rollout metrics gathered since its last log, and transformers cancels the step's pending
    log (``control.should_log``) after any log: a measurement logged from ``on_step_end`` took the step's rollout
    metrics and dropped its loss, gradient norm and learning rate (the loss then joined the next log's mean). Here
    the metrics stay for the step's log, and so does the pending log."""
    pending = control.should_log if control is not None else None
    metrics = getattr(trainer, "_metrics", None)  # GRPOTrainer's {"train": ..., "eval": ...}
    mode = "train" if trainer.model.training else "eval"
    held = metrics.get(mode) if isinstance(metrics, dict) else None
    if held is not None:
        metrics[mode] = collections.defaultdict(list)
    completions = getattr(trainer, "log_completions", False)  # GRPOTrainer would print and store the step's
    trainer.log_completions = False  # completions again with this entry
    try:
        trainer.log(logs)
    finally:
        trainer.log_completions = completions
        if held is not None:
            metrics[mode] = held
        if control is not None:
            control.should_log = pending


class PassAtKCallback(TrainerCallback):
    """Run :func:`evaluate` on ``dataset`` every ``eval_steps`` optimizer steps and log the numbers through the
    trainer's logging (``eval_passk/greedy``, ``eval_passk/T<t>/avg@k``, ``.../pass@k``, ``.../entropy``).

    A progress bar (main process) unless the trainer's ``disable_tqdm``; ``config.backend="vllm"`` samples with the
    trainer's vLLM engine (``use_vllm=True``).

    >>> trainer.add_callback(PassAtKCallback(trainer, load_default_dataset()["test"], EvalConfig(k=4), 50))
    """

    def __init__(self, trainer, dataset, config: EvalConfig | None = None, eval_steps: int = 50,
                 reward_funcs=accuracy_reward):
        if eval_steps < 1:
            raise ValueError(f"eval_steps must be >= 1, got {eval_steps}")
        config = config or EvalConfig(k=4)
        correctness_index([reward_funcs] if callable(reward_funcs) else list(reward_funcs))  # refused now, not later
        self.trainer, self.dataset, self.config = trainer, dataset, callback_config(trainer, config, config.backend)
        self.eval_steps, self.reward_funcs = eval_steps, reward_funcs

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.eval_steps or stopped_by_signal(self.trainer):
            return
        trainer = self.trainer
        res = evaluate_policy(trainer, self.dataset, self.reward_funcs, self.config,
                              name=f"pass@k step {state.global_step}")
        k = self.config.k
        logs = {"eval_passk/greedy": res["greedy"]} if "greedy" in res else {}
        for t, e in res["temperatures"].items():
            logs[f"eval_passk/T{t}/avg@{k}"] = e[f"avg@{k}"]
            logs[f"eval_passk/T{t}/pass@{k}"] = e["pass@k"][str(k)]
            if "entropy" in e:
                logs[f"eval_passk/T{t}/entropy"] = e["entropy"]
        log_apart(trainer, logs, control)


class HeldOutCallback(TrainerCallback):
    """Held-out accuracy before training (the base), every ``eval_steps`` optimizer steps and after the last step:
    greedy accuracy and avg@k at the trainer's sampling temperature, logged through the trainer as
    ``heldout/greedy`` and ``heldout/avg@k``. When training ends it prints base vs trained and writes
    ``<output_dir>/heldout.json`` and ``<output_dir>/heldout_curves.png`` (training reward and held-out accuracy
    against the step; without matplotlib the plot is skipped with a one-line note, ``plot=False`` skips it). Every process must take part (the sampling is sharded). Each measurement shows a progress
    bar with an ETA on the main process, unless the trainer's ``disable_tqdm``. ``backend="vllm"`` samples with
    the trainer's own vLLM engine (``use_vllm=True``; its current weights are pushed into it first), scored as with
    ``"hf"``.

    >>> trainer.add_callback(HeldOutCallback(trainer, load_default_dataset()["test"], k=4, eval_steps=50))
    """

    def __init__(self, trainer, dataset, k: int = 4, eval_steps: int = 50, reward_funcs=accuracy_reward,
                 max_completion_length: int | None = None, plot: bool = True, backend: str = "hf"):
        if eval_steps < 1:
            raise ValueError(f"eval_steps must be >= 1, got {eval_steps}")
        correctness_index([reward_funcs] if callable(reward_funcs) else list(reward_funcs))  # refused now, not later
        args = trainer.args
        self.trainer, self.dataset, self.eval_steps, self.reward_funcs, self.plot = (
            trainer, dataset, eval_steps, reward_funcs, plot)
        self.temperature = args.temperature
        self.config = callback_config(trainer, EvalConfig(
            k=k, temperatures=[args.temperature], top_p=args.top_p, compute_entropy=False,
            max_completion_length=max_completion_length or args.max_completion_length, seed=args.seed), backend)
        self.matplotlib = have_matplotlib() if plot else False  # without it: the numbers, and a note for the plot
        self.history: list[dict] = []

    def _measure(self, step: int, control=None) -> None:
        if self.history and self.history[-1]["step"] == step:
            return
        trainer = self.trainer
        res = evaluate_policy(trainer, self.dataset, self.reward_funcs, self.config, name=f"held-out step {step}")
        k, t = self.config.k, str(self.temperature)
        row = {"step": step, "greedy": res["greedy"], f"avg@{k}": res["temperatures"][t][f"avg@{k}"]}
        self.history.append(row)
        log_apart(trainer, {f"heldout/{key}": v for key, v in row.items() if key != "step"}, control)

    def on_train_begin(self, args, state, control, **kwargs):
        self._measure(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.eval_steps == 0 and not stopped_by_signal(self.trainer):
            self._measure(state.global_step, control)

    def on_train_end(self, args, state, control, **kwargs):
        if stopped_by_signal(self.trainer):  # preempted: the grace is the checkpoint's; the resumed run measures
            return
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
        if self.plot and self.matplotlib:
            plot_heldout_curves(record, out / "heldout_curves.png")
            lines.append(f"  curves: {out / 'heldout_curves.png'}")
        elif self.plot:
            lines.append("  " + PLOTS_SKIPPED.format(where=out / "heldout.json"))
        print("\n".join(lines), flush=True)
