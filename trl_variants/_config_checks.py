"""Config values checked when a config is built (its ``__post_init__``), before any model loads.

:func:`check_common`: ``GRPOConfig`` options that TRL 1.16 accepts but that fail later (after the model load, the
offline pass or the first generation) or silently do nothing. :func:`check_number`: the range check the method
configs use for their own number fields (a NaN or an infinity passed every ``x < 0`` check before). Each raises a
``ValueError`` naming the config class, the field, the value and the fix. ``docs/reliability.md`` ("Validated
inputs") lists them.
"""

from __future__ import annotations

import math
import operator
import os

TRL_CHOICES = {
    "loss_type": ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"),
    "scale_rewards": ("group", "batch", "none"),
    "importance_sampling_level": ("token", "sequence"),
    "multi_objective_aggregation": ("sum_then_normalize", "normalize_then_sum"),
}
"""The values TRL 1.16 reads for these string options. GRPOConfig takes any string and GRPOTrainer raises "Unknown
loss type" (or the like) only at the first generation or loss, after the model load and any offline pass. An
upgrade of TRL that documents another value fails ``trainers_tests/reliability/test_config_values.py``."""


def launch_processes() -> int:
    """The process count of this launch, before the training arguments are parsed: the launcher's environment
    (``WORLD_SIZE``, set by ``accelerate launch``, ``torchrun`` and accelerate's notebook launcher; MPI's sizes), else
    an accelerate ``PartialState`` already set up without a launcher, else 1. The configs' checks and the recipes'
    batch arithmetic (``training.batch``) read it here; ``training.run`` checks it against the parsed
    ``world_size``."""
    from accelerate import PartialState
    from accelerate.utils import get_int_from_env

    processes = get_int_from_env(["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"], 0)
    if processes:
        return processes
    return PartialState().num_processes if PartialState._shared_state else 1


def _num(value) -> float:
    """``value`` as a float (a YAML string such as "1e-6" included); NaN when it is not a number."""
    if isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def check_number(config, field: str, *, low: float | None = None, high: float | None = None, low_open: bool = False,
                 high_open: bool = False, fix: str, label: str = "") -> None:
    """``config.field`` is a finite number in ``[low, high]`` (an open end where ``low_open`` / ``high_open``),
    else a ``ValueError`` naming ``<config class>.<field>`` (``label``: how the paper calls it, e.g. "(eta)"), the
    range, the value and ``fix``."""
    value = getattr(config, field)
    x = _num(value)
    ok = math.isfinite(x) and (low is None or (x > low if low_open else x >= low)) \
        and (high is None or (x < high if high_open else x <= high))
    if ok:
        return
    if low is not None and high is not None:
        want = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
        want = f"{'>' if low_open else '>='} {low:g}"
    elif high is not None:
        want = f"{'<' if high_open else '<='} {high:g}"
    else:
        want = "a number"
    name = f"{field} {label}".strip()
    raise ValueError(f"{type(config).__name__}.{name} must be {want} and finite, got {value!r}: {fix}")


def refuse_inert(config, why: dict[str, str]) -> None:
    """``why``: the fields that change nothing given the others, each with the reason and the fix. Those set to
    anything but their default are refused, all named in one message (ERPO's rule, ``ERPOConfig._check_erpo_options``,
    for every config): an option that would be ignored without a word."""
    import dataclasses

    defaults = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                for f in dataclasses.fields(config)}
    unused = [f"{name}={getattr(config, name)!r} {text}" for name, text in why.items()
              if getattr(config, name) != defaults[name]]
    if unused:
        raise ValueError(f"{type(config).__name__}: " + "; ".join(unused))


_KINDS = {"int": "an integer", "float": "a number", "bool": "True or False"}


def _declared_kind(annotation) -> str | None:
    """"int", "float" or "bool" where a field is declared as that type (or it or None), else None."""
    text = annotation if isinstance(annotation, str) else annotation.__name__ if isinstance(annotation, type) \
        else str(annotation)  # int | None, typing.Optional[int]
    text = text.removeprefix("typing.")
    if text.startswith("Optional[") and text.endswith("]"):
        text = text[len("Optional["):-1]
    text = text.removesuffix(" | None").removeprefix("None | ")
    return text if text in _KINDS else None


def _declaring_module(config, name: str) -> str:
    """The module of the class that declares (or re-declares) field ``name``, the most derived first."""
    for cls in type(config).__mro__:
        if name in vars(cls).get("__annotations__", {}):
            return cls.__module__
    return ""


def _check_types(config, bad) -> None:
    """Every field TRL's ``GRPOConfig`` or a method's config declares ``int``, ``float`` or ``bool`` holds one.
    A dataclass takes any value: ``dph_coef="0.2"`` passed the whole offline pass and failed in the first loss,
    ``num_presamples=2.0`` inside the pass's generation, ``entropy_threshold="0.3"`` at the first rollout, and
    ``use_query_weights="false"`` is true. numpy's numbers are numbers. Fields only transformers'
    ``TrainingArguments`` declares are left to it: its ``__post_init__`` stores strings in some of its own
    (``include_num_input_tokens_seen="no"``), which a config built again from a built one holds."""
    import dataclasses
    import numbers

    for f in dataclasses.fields(config):
        kind, value = _declared_kind(f.type), getattr(config, f.name, None)
        if kind is None or value is None or _declaring_module(config, f.name).startswith("transformers"):
            continue
        if kind == "bool":
            ok = not isinstance(value, str)
        elif isinstance(value, bool):
            ok = False
        else:
            ok = isinstance(value, numbers.Integral if kind == "int" else numbers.Real)
        if ok:
            if type(value).__module__ == "numpy":  # a plain number: the config's JSON, checkpoints and cache keys
                setattr(config, f.name, value.item())
            continue
        if isinstance(value, str):
            fix = ("pass a number, not a string (a YAML file read by hand reads 1e-6, without a dot, as a string: "
                   "write 1.0e-6)"
                   if kind != "bool" else "pass True or False, not a string (the string 'false' is true)")
        elif kind == "int" and isinstance(value, float) and value.is_integer():
            fix = f"pass the whole number {int(value)}"
        else:
            fix = f"pass {_KINDS[kind]}"
        bad(f.name, value, f"{_KINDS[kind]} ({type(value).__name__} given)", fix)


def _check_batch_fields(config, bad) -> None:
    """Batch sizes below 1 passed GRPOConfig's divisibility checks (0 % G == 0) and failed inside ``train()`` (the
    sampler's "batch_size should be a positive integer"), or in A*-PO's ``__init__`` with a ZeroDivisionError."""
    for field, optional in (("per_device_train_batch_size", False), ("gradient_accumulation_steps", False),
                            ("steps_per_generation", True), ("generation_batch_size", True)):
        value = getattr(config, field, None)
        if value is None and optional:
            continue
        try:
            whole = None if isinstance(value, bool) else operator.index(value)
        except TypeError:
            whole = None
        if whole is None or whole < 1:
            bad(field, value, "an integer >= 1" + (" (or None)" if optional else ""),
                "it counts rows or micro-steps; docs/distributed.md explains the batch arithmetic")


def _check_trl_choices(config, bad) -> None:
    for field, choices in TRL_CHOICES.items():
        value = getattr(config, field, None)
        if field == "scale_rewards" and isinstance(value, bool):
            continue  # GRPOConfig maps True / False to "group" / "none"
        if value not in choices:
            text = str(value).strip().lower()
            hint = (f"; from the command line {value!r} is a string: write {'group' if text == 'true' else 'none'!r}"
                    if field == "scale_rewards" and text in ("true", "false") else "")
            bad(field, value, f"one of {list(choices)}", f"GRPOTrainer reads no other value{hint}")


def check_common(config) -> None:
    """Options of ``GRPOConfig`` that TRL 1.16 accepts but that fail later (after the model load, or the reference
    pass), or do nothing: batch sizes, sampling, lengths, learning rate, PPO clipping, the KL and entropy
    coefficients, the loss and advantage options' names. ``GRPOConfig`` itself already checks
    ``num_generations >= 2`` and the batch / generation-batch divisibility, so those are not repeated here."""
    name = type(config).__name__

    def bad(field: str, value, want: str, fix: str):
        raise ValueError(f"{name}.{field} must be {want}, got {value!r}: {fix}")

    _check_types(config, bad)
    _check_batch_fields(config, bad)
    t = config.temperature
    if not (math.isfinite(_num(t)) and _num(t) > 0):
        bad("temperature", t, "a finite number > 0", "log-probs are divided by it; for near-greedy sampling use a "
            "small value such as 0.01")
    m = config.max_completion_length
    if m is not None and not _num(m) >= 1:
        bad("max_completion_length", m, "an integer >= 1", "set the number of new tokens to generate, e.g. 256")
    lr = config.learning_rate
    if not (math.isfinite(_num(lr)) and _num(lr) >= 0):
        bad("learning_rate", lr, "a finite number >= 0", "use e.g. 1e-6 (0 freezes the weights)")
    p = config.top_p
    if not 0 < _num(p) <= 1:
        bad("top_p", p, "in (0, 1]", "1.0 disables nucleus sampling")
    k = config.top_k
    if k is not None and not _num(k) >= 0:
        bad("top_k", k, "an integer >= 0", "0 disables top-k filtering")
    mp = getattr(config, "min_p", None)
    if mp is not None and not 0 <= _num(mp) <= 1:
        bad("min_p", mp, "None or in [0, 1]", "None disables min-p filtering")
    rp = config.repetition_penalty
    if not (math.isfinite(_num(rp)) and _num(rp) > 0):
        bad("repetition_penalty", rp, "a finite number > 0", "1.0 disables the penalty")
    if not _num(config.num_iterations) >= 1:
        bad("num_iterations", config.num_iterations, "an integer >= 1", "1 is one optimization pass per generation")
    for field in ("epsilon", "epsilon_high"):
        e = getattr(config, field, None)
        if e is not None and not (math.isfinite(_num(e)) and _num(e) >= 0):
            bad(field, e, "a finite number >= 0", "it is the PPO clipping range, e.g. 0.2")
    beta = getattr(config, "beta", 0.0)
    if not (math.isfinite(_num(beta)) and _num(beta) >= 0):
        bad("beta", beta, "a finite number >= 0", "it weighs the KL to the reference (a negative one pushes the policy "
            "away from it); 0 turns the KL off")
    ec = getattr(config, "entropy_coef", 0.0)
    if not math.isfinite(_num(ec)):
        bad("entropy_coef", ec, "a finite number", "0 turns the entropy bonus off")
    g = config.max_grad_norm
    if g is not None and not (math.isfinite(_num(g)) and _num(g) >= 0):
        bad("max_grad_norm", g, "None or a finite number >= 0", "it is the gradient-clipping norm, e.g. 1.0; 0 or "
            "None turns clipping off")
    q = getattr(config, "top_entropy_quantile", 1.0)
    if not 0 <= _num(q) <= 1:
        bad("top_entropy_quantile", q, "in [0, 1]", "it is the fraction of highest-entropy tokens the loss keeps; 1.0 "
            "keeps every token")
    d = getattr(config, "delta", None)
    if d is not None and not (math.isfinite(_num(d)) and _num(d) > 1):
        bad("delta", d, "None or a finite number > 1", "it is the upper clip of the ratio in the two-sided loss: at or "
            "below 1 it clips the on-policy ratio 1 itself and nothing trains. The INTELLECT-2 paper uses 4; None "
            "turns it off")
    _check_trl_choices(config, bad)
    if getattr(config, "use_vllm", False) and getattr(config, "use_transformers_continuous_batching", False):
        raise ValueError(f"{name}: use_vllm and use_transformers_continuous_batching are both set, and GRPOTrainer "
                         "would generate with vLLM alone: choose one engine")
    launched = os.environ.get("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and launched in ("bf16", "fp16") \
            and not (config.bf16 or config.fp16):
        raise ValueError(
            f"{name}: the launcher's DeepSpeed config runs {launched} (accelerate launch: mixed_precision {launched}) "
            f"but {name}.{launched} is false, which transformers refuses only inside train(), after the model loads "
            f"and the offline pass has run (a DeepSpeed config mismatch): set --{launched} true, or launch with "
            "--mixed_precision no")
    if getattr(config, "use_transformers_continuous_batching", False):
        _check_continuous_batching_options(config, name, _num(rp))


def _check_continuous_batching_options(config, name: str, repetition_penalty: float) -> None:
    from .generation import check_continuous_batching  # TRL's generate_batch path drops them

    check_continuous_batching(repetition_penalty=repetition_penalty, generation_kwargs=config.generation_kwargs,
                              flag=f"{name}.use_transformers_continuous_batching")
    from ._numerics import mixed_precision, uses_fsdp

    if mixed_precision(config) and uses_fsdp(config):
        raise ValueError(
            f"{name}.use_transformers_continuous_batching under FSDP with bf16/fp16 is refused: TRL 1.16 casts the "
            "gathered policy to bf16 in place before generating, and the trainers here keep the float32 weights "
            "and run the model's own forward only without FSDP (FSDP has not run on a GPU here). Generate with "
            "vLLM (use_vllm: true), with HF generate (drop use_transformers_continuous_batching), or train under "
            "DeepSpeed ZeRO")
    processes = launch_processes()
    if uses_fsdp(config) and processes > 1:
        raise ValueError(
            f"{name}.use_transformers_continuous_batching under FSDP with {processes} processes is refused: the "
            "engine schedules its own forward passes on each process, and under FSDP every forward gathers the "
            "weights from all processes, so the processes' collectives stop matching (2 CPU processes stopped "
            "with gloo's 'collective mismatch'; NCCL hangs). HF generate under FSDP steps the processes "
            "together (synced_gpus). Generate with HF generate (drop use_transformers_continuous_batching), with "
            "vLLM (use_vllm: true), or train under DeepSpeed ZeRO, whose ZeRO-3 weights TRL gathers before "
            "generating")
