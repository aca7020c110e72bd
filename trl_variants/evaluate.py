"""Evaluation as the four papers do it: greedy accuracy, avg@k and pass@k swept over sampling temperatures, token
entropy, response length, optional KL to a reference, and keep / exploration rates against a base model
(DPH-RL Sec. 6.1). Outputs a JSON file with every number (per-prompt correctness counts included), a Markdown
table and PNG plots.

A sample is correct when one reward function, the correctness function (default ``accuracy_reward``;
:func:`correctness_index`), gives it a value > 0; the other reward functions are reported beside it (their mean per
pass), never summed into correctness. A model loaded from a path goes to the accelerator (:func:`eval_device`), and
its device and dtype are printed.

>>> from trl_variants.evaluate import EvalConfig, evaluate, write_report
>>> results = evaluate("outputs/erpo-tiny", None, load_default_dataset()["test"], config=EvalConfig(k=8))
>>> write_report([results], "eval/")

The work is cut into chunks: one pass (greedy, or one temperature) over ``chunk_size`` prompts. Each chunk is sampled
and scored with the offline pass's own steps (:mod:`trl_variants.presample`: the same prompt tokenization, batched
generation, seeds and reward calls), seeded by its index, so its samples do not depend on interruptions or on the
number of processes; under ``accelerate launch`` the chunks are shared out between the processes. A progress bar
with an ETA counts prompts over all passes. With ``results_file`` every finished chunk is appended to a JSON-lines
file whose first line holds the run's key (model, weights, dataset, options, library versions): a rerun with the
same key reads the finished chunks back instead of sampling them again, and its numbers equal an uninterrupted
run's; a rerun with another key is refused, naming what differs (``restart=True`` starts over).

``backend`` picks what samples (:func:`make_generator`): transformers ``generate`` (``"hf"``) or an offline vLLM
engine built as the offline pass builds it, with GRPOConfig's ``vllm_*`` options (``"vllm"``). Everything after
sampling (rewards, counts, entropy, KL, the report) is the same code for both.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from transformers import TrainerCallback
from trl import GRPOConfig

from ._validation import (
    check_reward_column_values,
    check_train_dataset,
    checked_reward_funcs,
    ensure_pad_token,
)
from .generation import eos_token_ids, tokenize_prompts
from .presample import PresampleConfig, token_logps
from .presample.cache import model_signature
from .presample.logprobs import check_prompt_lengths, left_pad
from .presample.reward_calls import RewardModelReward, check_reward_columns, reward_fingerprint, reward_name
from .presample.runner import HFGenerator, _add_rewards, _process_shard
from .presample.vllm_backend import (
    check_vllm_options,
    offline_generator,
    trainer_generator,
    vllm_usable,
    vllm_version,
)
from .rewards import accuracy_reward

__all__ = ["EvalConfig", "HeldOutCallback", "PassAtKCallback", "ResultsFile", "check_backend", "correctness_index",
           "eval_device", "evaluate", "keep_and_exploration_rates", "make_generator", "pass_at_k", "plot_pass_at_k",
           "plot_temperature_sweep", "run_key", "write_report"]

BACKENDS = ("hf", "vllm")
VLLM_EXTRA = "pip install 'trl-variants[vllm]'"
DEFAULT_CORRECTNESS = "accuracy_reward"
"""The reward function whose value > 0 counts a sample as correct when none is named (the recipes train with it)."""


def eval_device(device=None) -> torch.device:
    """Where :func:`evaluate` puts a model it loads in a single process: ``device`` when given (``"cpu"``,
    ``"cuda:1"``), else the accelerator Accelerate picks for one process (``PartialState().device``: the GPU when
    CUDA is available, else the CPU)."""
    if device is not None:
        return torch.device(device)
    from accelerate import PartialState

    return torch.device(PartialState().device)


def correctness_index(reward_funcs: Sequence[Callable], correctness_func=None) -> int:
    """Which of ``reward_funcs`` decides correctness (a sample is correct when its value is > 0; the others are only
    reported): ``correctness_func`` (one of the functions, or its name), else the one named ``accuracy_reward``,
    else the only function. A reward model is never chosen unless named. Raises, naming the functions, when the
    choice is missing or ambiguous."""
    names = [reward_name(f) for f in reward_funcs]
    if correctness_func is not None and not isinstance(correctness_func, str):
        found = [i for i, f in enumerate(reward_funcs) if f is correctness_func]
        if not found:
            raise ValueError(f"correctness_func {reward_name(correctness_func)!r} is not one of the reward functions "
                             f"{names}: pass it in reward_funcs too")
        return found[0]
    if correctness_func is not None:
        if correctness_func not in names:
            raise ValueError(f"correctness_func {correctness_func!r} names none of the reward functions {names}: "
                             "name one of them, or add that function to reward_funcs")
        return names.index(correctness_func)
    if DEFAULT_CORRECTNESS in names:
        return names.index(DEFAULT_CORRECTNESS)
    if len(reward_funcs) == 1 and not isinstance(reward_funcs[0], RewardModelReward | torch.nn.Module):
        return 0
    if len(reward_funcs) == 1:
        raise ValueError(f"the only reward is the reward model {names[0]!r}, and its score > 0 does not mean a "
                         "correct answer: add a verifiable reward function (accuracy_reward) to decide correctness, "
                         "or count score > 0 as correct explicitly with correctness_func (--correctness_func "
                         "reward_model)")
    raise ValueError(f"evaluate counts a sample correct from one reward function, and none of {names} is "
                     f"{DEFAULT_CORRECTNESS}: name the one whose value > 0 means correct with correctness_func "
                     "(--correctness_func NAME); the others are reported beside it, never summed into correctness")


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


def _training_default(name: str):
    """The default of GRPOConfig's field ``name``: evaluation's vLLM engine takes training's options."""
    return GRPOConfig.__dataclass_fields__[name].default


@dataclass
class EvalConfig:
    """Options of :func:`evaluate`.

    Parameters:
        k: samples per prompt at each temperature (avg@k, pass@k' for every k' <= k).
        temperatures: sampling temperatures to sweep (ERPO sweeps 0.1-1.5).
        greedy: also measure greedy accuracy.
        top_p, max_completion_length: sampling options.
        compute_entropy: mean token entropy of the sampled completions (one scoring forward pass).
        seed: base seed (each temperature and chunk derives its own).
        generation_batch_size, logprob_batch_size: sequences per generate call / per scoring forward.
        chunk_size: prompts per chunk, the unit of progress, of resume and of work sharing between processes (a
            chunk is seeded by its index: another chunk size gives other, equally valid samples).
        backend: ``"hf"`` (transformers generate) or ``"vllm"`` (an offline vLLM engine; needs the ``vllm`` extra
            and a CUDA GPU).
        vllm_gpu_memory_utilization, vllm_tensor_parallel_size, vllm_max_model_length, vllm_model_impl: the vLLM
            engine's options, as GRPOConfig's fields of the same names (same defaults); resources only.
        use_transformers_continuous_batching, transformers_continuous_batching_config, cache_implementation: with
            ``backend="hf"``, how transformers generates, as GRPOConfig's fields of the same names (the offline
            pass's :class:`~trl_variants.presample.PresampleConfig` options): continuous batching
            (``model.generate_batch``, one call per chunk and temperature; refused with what it would drop) and
            ``generate``'s KV cache (e.g. ``"static"``). Part of a results file's key when set.
        show_progress: show a progress bar (on the main process).
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
    seed: int = field(default=0, metadata={"help": "Base seed (each temperature and chunk derives its own)."})
    generation_batch_size: int = field(default=128, metadata={"help": "Sequences per generate call."})
    logprob_batch_size: int = field(default=32, metadata={"help": "Sequences per scoring forward pass."})
    chunk_size: int = field(
        default=64,
        metadata={"help": "Prompts per chunk: the unit of progress, of resume and of work sharing between processes "
                          "(chunks are seeded by their index: another size gives other samples)."},
    )
    backend: str = field(
        default="hf",
        metadata={"help": "What samples: 'hf' (transformers generate) or 'vllm' (an offline vLLM engine built with "
                          f"the vllm_* options below; needs {VLLM_EXTRA} and a CUDA GPU)."},
    )
    vllm_gpu_memory_utilization: float = field(
        default=_training_default("vllm_gpu_memory_utilization"),
        metadata={"help": "--backend vllm: fraction of each GPU's memory the engine may take (GRPOConfig's field; "
                          "the rest holds the transformers model that scores entropy and KL)."},
    )
    vllm_tensor_parallel_size: int = field(
        default=_training_default("vllm_tensor_parallel_size"),
        metadata={"help": "--backend vllm: GPUs the engine spreads the model over (GRPOConfig's field; one process "
                          "only)."},
    )
    vllm_max_model_length: int | None = field(
        default=_training_default("vllm_max_model_length"),
        metadata={"help": "--backend vllm: the engine's context window (prompt + completion tokens; GRPOConfig's "
                          "field); None = the model's."},
    )
    vllm_model_impl: str = field(
        default=_training_default("vllm_model_impl"),
        metadata={"help": "--backend vllm: model implementation, 'vllm' or 'transformers' (GRPOConfig's field)."},
    )
    use_transformers_continuous_batching: bool = field(
        default=False,
        metadata={"help": "--backend hf: sample with transformers' continuous batching (model.generate_batch) "
                          "instead of generate (GRPOConfig's field)."},
    )
    transformers_continuous_batching_config: dict | str | None = field(
        default=None,
        metadata={"help": "--backend hf with continuous batching: transformers ContinuousBatchingConfig arguments "
                          "(JSON dict, e.g. '{\"max_batch_tokens\": 2048}'; GRPOConfig's field)."},
    )
    cache_implementation: str | None = field(
        default=None,
        metadata={"help": "--backend hf: the KV cache of generate, e.g. 'static' (GRPOConfig's field); None = the "
                          "model's default."},
    )
    show_progress: bool = field(default=True, metadata={"help": "Show a progress bar with an ETA."})

    # fields that do not change the numbers (left out of a results file's key)
    _NOT_IN_KEY = ("vllm_gpu_memory_utilization", "vllm_tensor_parallel_size", "vllm_max_model_length",
                   "show_progress")
    # transformers generation options, in a results file's key only when set (files written before they existed
    # keep their key)
    _HF_ENGINE_DEFAULTS = {"use_transformers_continuous_batching": False,
                           "transformers_continuous_batching_config": None, "cache_implementation": None}

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if not self.temperatures or any(not t > 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be a non-empty list of values > 0, got {self.temperatures}")
        if len({str(float(t)) for t in self.temperatures}) != len(self.temperatures):
            raise ValueError(f"temperatures has a value twice: {self.temperatures}")
        for name in ("max_completion_length", "generation_batch_size", "logprob_batch_size", "chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.vllm_tensor_parallel_size < 1:
            raise ValueError(f"vllm_tensor_parallel_size must be >= 1, got {self.vllm_tensor_parallel_size}")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(f"vllm_gpu_memory_utilization must be in (0, 1], got {self.vllm_gpu_memory_utilization}")
        if isinstance(self.transformers_continuous_batching_config, str):  # a JSON string from the command line
            self.transformers_continuous_batching_config = json.loads(self.transformers_continuous_batching_config)
        engine = [k for k, default in self._HF_ENGINE_DEFAULTS.items() if getattr(self, k) != default]
        if engine and self.backend != "hf":
            raise ValueError(f"{', '.join(engine)} are options of transformers generation (backend 'hf'), but "
                             f"backend={self.backend!r}: vLLM generates with its own engine. Remove them, or use "
                             "backend='hf'")
        if self.use_transformers_continuous_batching:
            from .generation import check_continuous_batching

            check_continuous_batching(continuous_batching_config=self.transformers_continuous_batching_config)

    def key_options(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in self._NOT_IN_KEY
                and (k not in self._HF_ENGINE_DEFAULTS or v != self._HF_ENGINE_DEFAULTS[k])}


# ---------------------------------------------------------------------------------------------- sampling ---
def check_backend(backend: str) -> None:
    """Raise, before anything is loaded, when ``backend`` cannot run here (``"vllm"`` without the vllm package or
    without a CUDA GPU), naming what to install."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "hf":
        return
    if vllm_version() is None:
        raise ImportError(f"--backend vllm needs the vllm package, which is not installed: {VLLM_EXTRA} (vLLM runs "
                          "on CUDA GPUs), or use --backend hf. Nothing was loaded or sampled.")
    if not vllm_usable():
        raise RuntimeError("--backend vllm needs a CUDA GPU, and none is visible: run on a GPU machine, or use "
                           "--backend hf. Nothing was loaded or sampled.")


def make_generator(config: EvalConfig, model, tokenizer, accelerator=None):
    """What samples the completions, the one place the backend is chosen: :class:`HFGenerator` (transformers
    ``generate``, or ``generate_batch`` with ``use_transformers_continuous_batching``, with ``config``'s
    ``cache_implementation``) or, for ``backend="vllm"``, the offline pass's vLLM engine
    (:func:`~trl_variants.presample.vllm_backend.offline_generator`, built from ``config``'s ``vllm_*`` fields).
    Both have the offline pass's generator interface; everything after sampling is shared."""
    if config.backend == "vllm":
        return offline_generator(model, tokenizer, config, accelerator)
    return HFGenerator(model, tokenizer, continuous_batching=config.use_transformers_continuous_batching,
                       continuous_batching_config=config.transformers_continuous_batching_config,
                       cache_implementation=config.cache_implementation)


def _pass_config(config: EvalConfig, temperature: float | None) -> PresampleConfig:
    """The offline pass's options for one pass of the sweep (``temperature`` None: greedy)."""
    greedy = temperature is None
    temperature = 1.0 if greedy else temperature
    return PresampleConfig(
        num_samples=1 if greedy else config.k, greedy=greedy, temperature=temperature, top_p=config.top_p,
        max_completion_length=config.max_completion_length, record_prompt_logp=False, use_cache=False,
        seed=config.seed + int(round(temperature * 1000)), generation_batch_size=config.generation_batch_size,
        shard_size=config.chunk_size, show_progress=False,
    )


def _completion_stats(model, out, temperature, config, ref_model=None) -> dict:
    """Sums over a chunk's sampled completions: token entropy and token count, and (with ``ref_model``) the
    sequence log-ratio to the reference and the number of sequences."""
    rows = [(o["ref_prompt_ids"], c) for o in out for c in o["ref_completion_ids"]]
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
    stats = {"entropy_sum": ent_sum, "entropy_tokens": tok}
    if ref_model is not None:
        stats.update(kl_sum=kl_sum, kl_sequences=len(rows))
    return stats


def _run_chunk(model, tokenizer, rows, prompt_ids, row_indices, chunk, label, temperature, config, generator,
               reward_funcs, reference_model, correctness: int = 0) -> dict:
    """Sample and score one chunk (one pass over ``row_indices``); returns its record: per-prompt correct counts
    (samples whose ``reward_funcs[correctness]`` value is > 0; the other functions never count), the samples that
    function gave no value (``unrewarded``), each function's sum and count of values, the completions' total length,
    the samples that stopped at ``max_completion_length`` without an end-of-sequence token, and the entropy / KL
    sums."""
    pass_config = _pass_config(config, temperature)
    with torch.no_grad():
        out, _, _ = _process_shard(rows, prompt_ids, row_indices, chunk, model, tokenizer, pass_config, generator)
    _add_rewards(out, rows, pass_config, reward_funcs, [1.0] * len(reward_funcs))
    values = [v for o in out for v in o["ref_rewards_per_func"]]  # one row of per-function values per sample
    per_func = [[v[j] for v in values if not math.isnan(v[j])] for j in range(len(reward_funcs))]
    eos = set(eos_token_ids(tokenizer, model))
    completions = [c for o in out for c in o["ref_completion_ids"]]
    record = {"pass": label, "chunk": chunk, "rows": [row_indices[0], row_indices[-1] + 1],
              "correct": [sum(v[correctness] > 0 for v in o["ref_rewards_per_func"]) for o in out],
              "length_sum": sum(len(c) for c in completions),
              "unrewarded": sum(math.isnan(v[correctness]) for v in values),
              "reward_sums": [math.fsum(f) for f in per_func], "reward_counts": [len(f) for f in per_func],
              "stopped_at_limit": sum(len(c) >= config.max_completion_length and c[-1] not in eos
                                      for c in completions)}
    if temperature is not None and (config.compute_entropy or reference_model is not None):
        with torch.no_grad():
            record.update(_completion_stats(model, out, temperature, config, reference_model))
    return record


# ------------------------------------------------------------------------------------------ results file ---
def _normalized(obj):
    return json.loads(json.dumps(obj))


def _weights_id(model) -> dict:
    """Which weights ``model`` holds (:func:`~trl_variants.presample.cache.model_signature` at their own dtype)."""
    dtype = model_signature(model, dtypes=())["dtype"]
    signature = model_signature(model, dtypes=(dtype,) if dtype else ())
    return {"dtype": dtype, "hash": signature["hashes"].get(dtype)}


def _dataset_hash(dataset, prompt_ids) -> dict:
    h = hashlib.sha256()
    for batch in dataset.iter(batch_size=1000):
        h.update(json.dumps(batch, sort_keys=True, default=str).encode())
    ids = hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:16]
    return {"rows": len(dataset), "content": h.hexdigest()[:16], "prompt_ids": ids}


def _reward_id(func) -> list:
    """A reward function in a results file's key: its name and code fingerprint (a reward model: and its weights)."""
    model = getattr(func, "model", None) if isinstance(func, RewardModelReward) else None
    return [reward_name(func), reward_fingerprint(func)] + ([_weights_id(model)] if model is not None else [])


def run_key(model, dataset, prompt_ids, reward_funcs, config: EvalConfig, backend: str, reference_model=None,
            correctness: int = 0) -> dict:
    """Everything an evaluation's numbers depend on, as a flat dict (stored in a results file's header): the model
    (path and weights), the dataset (content and prompt token ids, which cover the tokenizer and chat template),
    the reward functions and the one that decides correctness (``reward_funcs[correctness]``), the options, the
    backend and the library versions."""
    from importlib import metadata

    key = {**config.key_options(),
           "model": str(getattr(model.config, "_name_or_path", "")), "model_weights": _weights_id(model),
           "dataset": _dataset_hash(dataset, prompt_ids),
           "reward_funcs": [_reward_id(f) for f in reward_funcs],
           "correctness_func": [correctness, *_reward_id(reward_funcs[correctness])],
           "reference_model": None if reference_model is None else {
               "model": str(getattr(reference_model.config, "_name_or_path", "")),
               "weights": _weights_id(reference_model)},
           "backend": backend,
           "versions": {pkg: metadata.version(pkg) for pkg in ("torch", "transformers", "trl-variants")}}
    return _normalized(key)


def legacy_key(key: dict) -> dict | None:
    """The key an evaluation with ``key`` had before correctness was decided by one function (earlier versions
    counted a sample correct when the sum of every reward was > 0), when that rule gives the same numbers: one reward
    function only (then the sum is that function). None otherwise."""
    if len(key["reward_funcs"]) != 1:
        return None
    return {k: v for k, v in key.items() if k != "correctness_func"}


def _describe_differences(old: dict, new: dict) -> str:
    diffs = []
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            diffs.append(f"{name}: {json.dumps(old.get(name))} in the file, {json.dumps(new.get(name))} now")
    return "; ".join(diffs)


class ResultsFile:
    """Finished chunks of one evaluation as JSON lines: a header ``{"kind": "header", "key": ...}`` and one
    ``{"kind": "chunk", "pass": ..., "chunk": ..., ...}`` line per chunk, appended (and flushed to disk) as each
    finishes. Opening reads the finished chunks back when the header's key equals ``key``; another key is refused,
    naming what differs, unless ``restart`` (then the file is started over). A last line cut by an interruption is
    dropped. Only the ``writer`` (the main process) writes. A file written before correctness was decided by one
    function is read when its rule gave the same numbers (:func:`legacy_key`), refused otherwise."""

    def __init__(self, path, key: dict, restart: bool = False, writer: bool = True):
        self.path, self.key, self.writer = Path(path), key, writer
        self.accepted = [key] + ([legacy_key(key)] if "correctness_func" in key and legacy_key(key) else [])
        self.done: dict[tuple[str, int], dict] = {}
        self._valid_bytes = 0  # the length of the readable part (a cut last line is dropped)
        self._fresh = restart or not self.path.exists() or self.path.stat().st_size == 0
        if not self._fresh:
            self._read()

    def _read(self):
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        complete = lines[:-1]  # everything before the last newline; what follows it is a cut line (or nothing)
        if lines[-1].strip():
            warnings.warn(f"{self.path}: the last line was cut (an interrupted write); that chunk is computed again",
                          stacklevel=3)
        try:
            header = json.loads(complete[0]) if complete else None
        except json.JSONDecodeError:
            header = None
        if not isinstance(header, dict) or header.get("kind") != "header":
            raise ValueError(f"{self.path} is not an evaluation results file (no header line): remove it, choose "
                             "another output directory, or restart (--restart true / restart=True) to overwrite it")
        stripped = {k: v for k, v in self.key.items() if k != "correctness_func"}
        if header["key"] not in self.accepted and header["key"] == stripped:  # only the correctness rule differs
            funcs = [f[0] for f in header["key"].get("reward_funcs") or []]
            raise ValueError(f"{self.path} was written by an earlier version of evaluate, which counted a sample "
                             f"correct when the sum of all its rewards ({', '.join(funcs)}) was > 0; now only "
                             f"{self.key['correctness_func'][1]} decides, and the others are reported beside it. "
                             "Restart (--restart true / restart=True) to evaluate again under this rule, or choose "
                             "another output directory")
        if header["key"] not in self.accepted:
            differences = _describe_differences(header["key"], self.key)
            raise ValueError(f"{self.path} holds the results of another evaluation ({differences}). Rerun with the "
                             "same model and options to resume it, choose another output directory, or restart "
                             "(--restart true / restart=True) to discard it and start over")
        for record in chunk_records(self.path, complete):
            self.done.setdefault((record["pass"], record["chunk"]), record)
        self._valid_bytes = sum(len(line) + 1 for line in complete)

    @staticmethod
    def check(path) -> None:
        """Refuse, naming the file, the line and the fix, a results file whose finished chunks cannot be read back (a
        damaged line before the last one): ``trl-variants evaluate`` runs it before any model loads. A missing or
        empty file, or a cut last line (an interrupted write, computed again), passes."""
        path = Path(path)
        if path.is_file() and path.stat().st_size:
            chunk_records(path, path.read_bytes().split(b"\n")[:-1])

    def start(self) -> None:
        """Write the header of a new file, or cut a partly written last line off an old one (writer only)."""
        if not self.writer:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self._fresh:
            self._write_lines([{"kind": "header", "key": self.key}], mode="w")
        elif self.path.stat().st_size != self._valid_bytes:
            with open(self.path, "r+b") as f:
                f.truncate(self._valid_bytes)

    def append(self, record: dict) -> None:
        self.done.setdefault((record["pass"], record["chunk"]), record)
        if self.writer:
            self._write_lines([{"kind": "chunk", **record}], mode="a")

    def _write_lines(self, records, mode):
        with open(self.path, mode) as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
            f.flush()
            os.fsync(f.fileno())


def chunk_records(path, complete: list[bytes]) -> list[dict]:
    """The chunk records of a results file's complete lines (the header first, skipped), each checked: a line that is
    not a JSON chunk record is refused naming the file, its line number and the fix."""
    records = []
    for number, line in enumerate(complete[1:], start=2):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "pass" not in record or "chunk" not in record:
                raise ValueError("not a chunk record")
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            shown = line[:60].decode("utf-8", "replace")
            raise ValueError(f"{path}, line {number}, is damaged ({e}; it starts {shown!r}): the finished chunks "
                             "after it cannot be trusted. Rerun with --restart true (restart=True) to evaluate this "
                             "model again from the start, or remove that file (or only its lines from line "
                             f"{number} on, to keep the chunks before it)") from None
        records.append(record)
    return records


# ----------------------------------------------------------------------------------------------- evaluate ---
def _pass_extras(chunks: list[dict], reward_labels: list[str], samples_per_prompt: int) -> dict:
    """A pass's mean value of each reward function (over the samples it scored) and the share of samples that
    stopped at max_completion_length, from its chunk records; a number is left out when a chunk read back from a
    file written by an earlier version lacks it."""
    extras: dict = {}
    if all("reward_sums" in r for r in chunks):
        sums = [math.fsum(r["reward_sums"][j] for r in chunks) for j in range(len(reward_labels))]
        counts = [sum(r["reward_counts"][j] for r in chunks) for j in range(len(reward_labels))]
        extras["reward_means"] = {name: s / c if c else float("nan")
                                  for name, s, c in zip(reward_labels, sums, counts, strict=True)}
    if all("stopped_at_limit" in r for r in chunks):
        samples = samples_per_prompt * sum(len(r["correct"]) for r in chunks)
        extras["stopped_at_limit"] = sum(r["stopped_at_limit"] for r in chunks) / samples
    return extras


def reward_labels(reward_funcs) -> list[str]:
    """The reward functions' names as the results name them (a repeated name gets ``#2``, ``#3``...)."""
    names = [reward_name(f) for f in reward_funcs]
    return [n if names[:i].count(n) == 0 else f"{n}#{names[:i].count(n) + 1}" for i, n in enumerate(names)]


def _aggregate(records: dict, passes, n_chunks: int, config: EvalConfig, dataset, with_entropy: bool,
               with_kl: bool, base_results: dict | None, labels: list[str] | None = None) -> dict:
    """The numbers of every pass, from the chunk records in chunk order (the same sums whether the records were
    computed now or read back)."""
    out: dict = {"temperatures": {}}
    n = config.k
    for label, temperature in passes:
        chunks = [records[(label, c)] for c in range(n_chunks)]
        correct = [c for r in chunks for c in r["correct"]]
        extras = _pass_extras(chunks, labels or [], 1 if temperature is None else n)
        if temperature is None:
            out["greedy"] = sum(c > 0 for c in correct) / len(correct)
            out.update({f"greedy_{k}": v for k, v in extras.items()})
            continue
        entry = {
            f"avg@{n}": sum(correct) / (n * len(correct)),
            "pass@k": {str(kk): sum(pass_at_k(n, c, kk) for c in correct) / len(correct) for kk in ks_up_to(n)},
            "mean_length": sum(r["length_sum"] for r in chunks) / (n * len(correct)),
            "correct": correct,
            **extras,
        }
        if "level" in dataset.column_names:
            levels = dataset["level"]
            entry["avg_by_level"] = {str(lv): sum(c for c, l_ in zip(correct, levels, strict=True) if l_ == lv)
                                     / (n * sum(1 for l_ in levels if l_ == lv)) for lv in sorted(set(levels))}
        if with_entropy:
            entry["entropy"] = sum(r["entropy_sum"] for r in chunks) / max(sum(r["entropy_tokens"] for r in chunks), 1)
        if with_kl:  # MC estimate of KL(pi || pi_ref) per sequence
            entry["kl_to_reference"] = sum(r["kl_sum"] for r in chunks) / max(sum(r["kl_sequences"] for r in chunks), 1)
        if base_results is not None:
            base = base_results["temperatures"].get(label)
            if base is None:
                raise ValueError(f"base_results has no temperature {label}: evaluate the base at the same temperatures")
            entry.update(keep_and_exploration_rates([c > 0 for c in base["correct"]], [c > 0 for c in correct]))
        out["temperatures"][label] = entry
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
    results_file=None,
    restart: bool = False,
    generator=None,
    correctness_func: Callable | str | None = None,
    device=None,
    dtype=None,
    chat_template_kwargs: dict | None = None,
) -> dict:
    """Evaluate one model on ``dataset`` (``prompt`` + the columns the rewards read, e.g. ``solution``).

    A sample is correct when ONE reward function, ``correctness_func`` (one of ``reward_funcs`` or its name;
    default: ``accuracy_reward``, or the only function; :func:`correctness_index`), gives it a value > 0; every
    function's mean value is reported beside (``reward_means``), never summed into correctness.

    ``model`` / ``reference_model``: a path or Hub id, or a model object (then ``tokenizer`` is required; the vLLM
    backend needs a path, as it loads its own copy of the weights).
    ``base_results``: the result dict of the base model on the same prompts: adds keep / exploration rates.
    ``accelerator``: an ``Accelerator`` or ``PartialState`` sharing the chunks between processes (every process
    must call, and every one returns the full result).
    ``results_file``: a JSON-lines file the finished chunks are appended to and resumed from (module docstring);
    ``restart``: discard what it holds. ``generator``: what samples, replacing the ``config.backend`` one (the
    held-out callback passes the trainer's vLLM engine).
    ``device``: where a model loaded from a path goes in a single process (default :func:`eval_device`: the GPU
    when there is one; a model object stays where it is unless ``device`` is given; with ``accelerator``, its
    device); the device and dtype are printed. ``dtype``: ``from_pretrained``'s (``"bfloat16"``, ``"auto"``...).
    ``chat_template_kwargs``: extra ``apply_chat_template`` arguments for conversational prompts.
    Returns a dict: ``name``, ``config``, ``correctness_func`` and ``reward_funcs`` (names), ``greedy`` accuracy,
    and per temperature ``avg@k``, ``pass@k'``, ``entropy``, ``mean_length``, ``kl_to_reference`` (if asked), the
    per-prompt ``correct`` counts, ``reward_means`` (each function's mean value), ``stopped_at_limit`` (the share
    of samples cut at ``max_completion_length``) and keep / exploration rates (if ``base_results``); greedy's
    ``reward_means`` and ``stopped_at_limit`` are ``greedy_reward_means`` and ``greedy_stopped_at_limit``.
    """
    from accelerate.utils import gather_object
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = config or EvalConfig()
    reward_funcs = [reward_funcs] if callable(reward_funcs) else list(reward_funcs)
    if not reward_funcs:
        raise ValueError("evaluate needs at least one reward function")
    correctness = correctness_index(reward_funcs, correctness_func)  # before the wrapping (identity is kept)
    reward_funcs = checked_reward_funcs(reward_funcs)  # as the offline pass: bad values refused, naming the function
    # --- every check before anything loads ---
    if generator is None:
        check_backend(config.backend)
        if config.backend == "vllm" and not isinstance(model, str | Path):
            raise ValueError("backend='vllm' needs the model as a path or Hub id: vLLM loads its own copy of the "
                             "weights, which could differ from the model object passed. Pass the path, or use "
                             "backend='hf'")
    dataset = dataset.select_columns([c for c in dataset.column_names if not c.startswith("ref_")])
    check_train_dataset(dataset, "evaluate", split="dataset")
    if len(dataset) == 0:
        raise ValueError("the dataset is empty")
    if not reward_funcs:
        raise ValueError("evaluate needs at least one reward function")
    check_reward_columns(reward_funcs, dataset.column_names)
    check_reward_column_values(reward_funcs, dataset, "evaluate")  # no None where a reward function reads a column
    passes = ([("greedy", None)] if config.greedy else []) + [(str(t), t) for t in config.temperatures]
    if config.backend == "vllm" or generator is not None:
        for _, t in passes:
            check_vllm_options(_pass_config(config, t))
    # --- load ---
    loaded = isinstance(model, str | Path)
    load_kwargs = {"dtype": dtype} if dtype is not None else {}
    if loaded:
        name = name or Path(str(model)).name
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(model), padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(str(model), **load_kwargs)
    if isinstance(reference_model, str | Path):
        reference_model = AutoModelForCausalLM.from_pretrained(str(reference_model), **load_kwargs)
    if tokenizer is None:
        raise ValueError("tokenizer is required when model is a model object")
    ensure_pad_token(tokenizer)  # as GRPOTrainer: no pad token (Llama 3, Mistral) pads with EOS
    if accelerator is not None:
        device = accelerator.device
    elif loaded or device is not None:
        device = eval_device(device)
    else:  # a model object (a trainer's policy) stays where it is
        device = next(model.parameters()).device
    name = name or getattr(model.config, "_name_or_path", "model")
    scores = config.compute_entropy or reference_model is not None
    moved = config.backend == "hf" or generator is not None or scores
    if moved:
        model = model.to(device)  # with its own vLLM engine and nothing to score, the model stays off the GPU
    if loaded and (accelerator is None or accelerator.is_main_process):
        dtype_name = str(next(model.parameters()).dtype).removeprefix("torch.")
        where = f"evaluate {name}: model on {device if moved else next(model.parameters()).device} ({dtype_name})"
        if generator is None and config.backend == "vllm":
            where += (": it scores the entropy / KL of vLLM's samples" if scores else ", unused: vLLM samples and "
                      "nothing is scored (compute_entropy false, no reference model)")
            if scores and device.type == "cpu":
                where += "; on the CPU this pass is slow: --compute_entropy false skips it"
        print(where, flush=True)
    if reference_model is not None:
        reference_model = reference_model.to(device)
    prompt_ids = tokenize_prompts(tokenizer, list(dataset["prompt"]), None, chat_template_kwargs)
    check_prompt_lengths(prompt_ids, minimum=1)

    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator is not None else (0, 1)
    n_chunks = math.ceil(len(dataset) / config.chunk_size)
    units = [(label, t, c) for label, t in passes for c in range(n_chunks)]
    store = None
    if results_file is not None:
        backend = generator.name if generator is not None else (
            f"vllm=={vllm_version()}" if config.backend == "vllm" else "hf")
        key = run_key(model, dataset, prompt_ids, reward_funcs, config, backend, reference_model, correctness)
        store = ResultsFile(results_file, key, restart=restart, writer=rank == 0)
        if world > 1:
            accelerator.wait_for_everyone()  # every process has read the file before the main one writes it
        store.start()
    records = dict(store.done) if store is not None else {}
    todo = [u for u in units if (u[0], u[2]) not in records]

    def chunk_rows(c):
        return list(range(c * config.chunk_size, min(len(dataset), (c + 1) * config.chunk_size)))

    done_prompts = sum(len(chunk_rows(c)) for label, _, c in units if (label, c) in records)
    if rank == 0 and done_prompts:
        print(f"evaluate {name}: {len(units) - len(todo)} of {len(units)} chunks read back from {results_file}",
              file=sys.stderr, flush=True)
    bar = tqdm(total=len(passes) * len(dataset), initial=done_prompts, desc=f"evaluate {name}", unit="prompt",
               disable=rank != 0 or not config.show_progress, leave=None, dynamic_ncols=True)
    own_generator = generator is None
    if own_generator and (todo or world > 1):  # no engine for a finished run (but processes start together)
        generator = make_generator(config, model, tokenizer, accelerator)
    try:
        if generator is not None:
            generator.prepare()  # on every process, before any chunk (weight pushes are collectives)
        for start in range(0, len(todo), world):  # one chunk per process per round, then the results are gathered
            round_units = todo[start : start + world]
            mine = round_units[rank] if rank < len(round_units) else None
            record = None
            if mine is not None:
                label, temperature, c = mine
                bar.set_postfix_str("greedy" if temperature is None else f"T={label}")
                rows_idx = chunk_rows(c)
                record = _run_chunk(model, tokenizer, list(dataset.select(rows_idx)),
                                    [prompt_ids[i] for i in rows_idx], rows_idx, c, label, temperature, config,
                                    generator, reward_funcs, reference_model, correctness=correctness)
            finished = [r for r in gather_object([record]) if r is not None] if world > 1 else [record]
            for r in finished:
                if store is not None:
                    store.append(r)
                records[(r["pass"], r["chunk"])] = r
                bar.update(len(r["correct"]))
    finally:
        bar.close()
        if generator is not None:
            generator.finish()
    missing = [(label, c) for label, _, c in units if (label, c) not in records]
    if missing:  # e.g. N lone processes that were told they are N (no process group to share the results)
        raise RuntimeError(f"evaluate: no results for chunks {missing[:4]} ({len(missing)} in all) after every "
                           f"process finished its share ({world} processes): the processes did not exchange their "
                           "results. Launch with accelerate launch or torchrun on a working process group")
    unrewarded = sum(r.get("unrewarded", 0) for r in records.values())
    labels = reward_labels(reward_funcs)
    if unrewarded and rank == 0:
        warnings.warn(f"evaluate: {unrewarded} completions got no value from the correctness function "
                      f"{labels[correctness]} (None or NaN): they never count as correct", stacklevel=2)
    results: dict = {"name": name, "config": asdict(config), "num_prompts": len(dataset),
                     "correctness_func": labels[correctness], "reward_funcs": labels}
    results.update(_aggregate(records, passes, n_chunks, config, dataset, config.compute_entropy or
                              reference_model is not None, reference_model is not None, base_results, labels))
    return results


# ------------------------------------------------------------------------------------------------- reports ---
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


def _plt():
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


# ------------------------------------------------------------------------------------- training callback ---
def callback_config(trainer, config: EvalConfig, backend: str = "hf") -> EvalConfig:
    """``config`` as a training callback runs it: the progress bar off when the trainer's ``disable_tqdm`` is set,
    and ``backend`` checked: ``"vllm"`` samples with the trainer's own vLLM engine, so it needs ``use_vllm=True``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "vllm" and not getattr(trainer, "use_vllm", False):
        raise ValueError("backend='vllm' evaluates with the trainer's own vLLM engine (its current weights pushed "
                         "into it), and this trainer has none: set use_vllm=True in its config (vllm_mode "
                         f"'colocate' or 'server'; {VLLM_EXTRA}), or use backend='hf'")
    return replace(config, backend=backend, show_progress=config.show_progress and not trainer.args.disable_tqdm)


def evaluate_policy(trainer, dataset, reward_funcs, config: EvalConfig, name: str | None = None) -> dict:
    """:func:`evaluate` on a trainer's current policy (sharded over its processes when there are several), leaving
    the model in the train / eval mode it was in. Every process must call it. ``config.backend="vllm"``: sampled by
    the trainer's vLLM engine (:func:`~trl_variants.presample.vllm_backend.trainer_generator`), scored as with
    ``"hf"``."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    was_training = model.training
    multi = trainer.accelerator.num_processes > 1
    generator = trainer_generator(trainer) if config.backend == "vllm" else None
    res = evaluate(model, trainer.processing_class, dataset, reward_funcs, config, name=name,
                   accelerator=trainer.accelerator if multi else None, generator=generator)
    model.train(was_training)
    return res


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
        if state.global_step % self.eval_steps:
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
        trainer.log(logs)


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

    def _measure(self, step: int) -> None:
        if self.history and self.history[-1]["step"] == step:
            return
        trainer = self.trainer
        res = evaluate_policy(trainer, self.dataset, self.reward_funcs, self.config, name=f"held-out step {step}")
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
        if self.plot and self.matplotlib:
            plot_heldout_curves(record, out / "heldout_curves.png")
            lines.append(f"  curves: {out / 'heldout_curves.png'}")
        elif self.plot:
            lines.append("  " + PLOTS_SKIPPED.format(where=out / "heldout.json"))
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
