"""Sampling and scoring one chunk of an evaluation with the offline pass's own steps
(:func:`~trl_variants.presample.sample_shard`, :func:`~trl_variants.presample.score_shard`): where the model goes,
which backend samples, and the chunk's record (correct counts, reward sums, lengths, entropy and KL sums)."""

from __future__ import annotations

import math

import torch

from ..generation import eos_token_ids
from ..presample import HFGenerator, PresampleConfig, sample_shard, score_shard, token_logps
from ..presample.logprobs import left_pad
from ..presample.vllm_backend import offline_generator, vllm_usable, vllm_version
from .config import BACKENDS, VLLM_EXTRA, EvalConfig


def eval_device(device=None) -> torch.device:
    """Where :func:`evaluate` puts a model it loads in a single process: ``device`` when given (``"cpu"``,
    ``"cuda:1"``), else the accelerator Accelerate picks for one process (``PartialState().device``: the GPU when
    CUDA is available, else the CPU)."""
    if device is not None:
        return torch.device(device)
    from accelerate import PartialState

    return torch.device(PartialState().device)


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


def pass_config(config: EvalConfig, temperature: float | None) -> PresampleConfig:
    """The offline pass's options for one pass of the sweep (``temperature`` None: greedy)."""
    greedy = temperature is None
    temperature = 1.0 if greedy else temperature
    return PresampleConfig(
        num_samples=1 if greedy else config.k, greedy=greedy, temperature=temperature, top_p=config.top_p,
        max_completion_length=config.max_completion_length, record_prompt_logp=False, use_cache=False,
        seed=config.seed + int(round(temperature * 1000)), generation_batch_size=config.generation_batch_size,
        shard_size=config.chunk_size, show_progress=False,
    )


def completion_stats(model, out, temperature, config, ref_model=None) -> dict:
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


def run_chunk(model, tokenizer, rows, prompt_ids, row_indices, chunk, label, temperature, config, generator,
              reward_funcs, reference_model, correctness: int = 0) -> dict:
    """Sample and score one chunk (one pass over ``row_indices``) with the offline pass's steps; returns its
    record: per-prompt correct counts (samples whose ``reward_funcs[correctness]`` value is > 0; the other functions
    never count), the samples that function gave no value (``unrewarded``), each function's sum and count of
    values, the completions' total length, the samples that stopped at ``max_completion_length`` without an
    end-of-sequence token, and the entropy / KL sums."""
    options = pass_config(config, temperature)
    with torch.no_grad():
        out, _, _ = sample_shard(rows, prompt_ids, row_indices, chunk, model, tokenizer, options, generator)
    score_shard(out, rows, options, reward_funcs, [1.0] * len(reward_funcs))
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
            record.update(completion_stats(model, out, temperature, config, reference_model))
    return record
