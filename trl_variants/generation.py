"""Prompt tokenization and batched Hugging Face generation shared by the offline passes (presampling, evaluation).

Prompts are tokenized exactly as TRL 1.16's ``GRPOTrainer._tokenize_prompts`` does (chat template with the
generation prompt for conversational prompts, the tokenizer's own call for plain text), so a completion sampled
here is one the trainer could have sampled.

Two ways to generate, as GRPOTrainer's: ``model.generate`` on left-padded batches (optionally with a static KV cache,
GRPOConfig's ``cache_implementation``), or transformers' continuous batching, ``model.generate_batch``
(GRPOConfig's ``use_transformers_continuous_batching``; :func:`check_continuous_batching` lists what it cannot do).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import torch
from transformers import GenerationConfig
from trl.data_utils import is_conversational


def tokenize_prompts(tokenizer, prompts: Sequence, max_prompt_length: int | None = None, chat_template_kwargs=None):
    """Token ids of each prompt as GRPOTrainer feeds it; longer prompts keep their last ``max_prompt_length``
    tokens (left truncation: the generation prompt survives)."""
    prompts = list(prompts)
    if not prompts:
        return []
    if is_conversational({"prompt": prompts[0]}):
        ids = tokenizer.apply_chat_template(
            conversation=prompts, add_generation_prompt=True, tokenize=True, return_dict=True,
            **(chat_template_kwargs or {}),
        )["input_ids"]
    else:
        ids = tokenizer(text=prompts)["input_ids"]
    ids = [list(x) for x in ids]
    if max_prompt_length is not None:
        ids = [x[-max_prompt_length:] for x in ids]
    return ids


def pack_prompt_completion(prompts, completions, pad_token_id: int):
    """``(input_ids, attention_mask, prompt_width)`` for rows laid out as GRPOTrainer lays them out: the prompt
    left-padded to ``prompt_width``, the completion right-padded after it (width at least 1)."""
    P, C = max(map(len, prompts)), max(1, max(map(len, completions)))
    ids = torch.full((len(prompts), P + C), pad_token_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, P - len(p) : P], attn[i, P - len(p) : P] = torch.tensor(list(p), dtype=torch.long), 1
        if len(c):
            ids[i, P : P + len(c)], attn[i, P : P + len(c)] = torch.tensor(list(c), dtype=torch.long), 1
    return ids, attn, P


def eos_token_ids(tokenizer, model=None) -> list[int]:
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(i for i in ids if i is not None)


def truncate_after_eos(tokens: list[int], eos_ids: Sequence[int]) -> list[int]:
    """Tokens up to and including the first EOS (as GRPOTrainer keeps them)."""
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[: i + 1]
    return tokens


@torch.no_grad()
def generate_completions(
    model,
    tokenizer,
    prompt_ids: Sequence[Sequence[int]],
    num_samples: int = 1,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    generation_kwargs: dict | None = None,
    do_sample: bool = True,
    batch_size: int = 64,
    progress=None,
    cache_implementation: str | None = None,
    continuous_batching: bool = False,
    continuous_batching_config: dict | None = None,
) -> list[list[list[int]]]:
    """Sample ``num_samples`` completions for every prompt with ``model.generate``, or with continuous batching.

    Returns, per prompt, a list of ``num_samples`` completion token lists (cut after the first EOS, EOS kept).
    ``batch_size`` counts sequences (prompt x sample) per ``generate`` call. ``progress`` is called with the
    number of prompts finished after each call. The sampling options are GRPOTrainer's (``min_p`` 0 and
    ``repetition_penalty`` 1 are off); ``generation_kwargs`` override them, as GRPOConfig's do.
    ``cache_implementation``: the KV cache ``generate`` uses (e.g. ``"static"``), as GRPOConfig's.
    ``continuous_batching``: generate with ``model.generate_batch`` instead, all the prompts in one call that the
    engine schedules itself (``batch_size`` is not used; ``continuous_batching_config`` sizes its batches, see
    :func:`generate_completions_continuous`).
    """
    if continuous_batching:
        return generate_completions_continuous(
            model, tokenizer, prompt_ids, num_samples, max_new_tokens=max_new_tokens, temperature=temperature,
            top_p=top_p, top_k=top_k, min_p=min_p, repetition_penalty=repetition_penalty,
            generation_kwargs=generation_kwargs, do_sample=do_sample, progress=progress,
            continuous_batching_config=continuous_batching_config)
    device = next(model.parameters()).device
    eos = eos_token_ids(tokenizer, model)
    config = _generation_config(tokenizer, eos, max_new_tokens, temperature, top_p, top_k, min_p, repetition_penalty,
                                generation_kwargs, do_sample, cache_implementation)
    per_call = max(1, batch_size // num_samples)
    was_training = model.training
    model.eval()
    out: list[list[list[int]]] = []
    try:
        for start in range(0, len(prompt_ids), per_call):
            chunk = [list(p) for p in prompt_ids[start : start + per_call] for _ in range(num_samples)]
            width = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, p in enumerate(chunk):
                ids[i, width - len(p) :] = torch.tensor(p)
                mask[i, width - len(p) :] = 1
            # synced_gpus=False: transformers turns it on whenever ZeRO-3 is active, making every process step with
            # the others; the offline passes run with full (gathered) weights and each process on its own shards
            gen = model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config, synced_gpus=False
            )[:, width:].tolist()
            for i in range(len(chunk) // num_samples):
                out.append([truncate_after_eos(g, eos) for g in gen[i * num_samples : (i + 1) * num_samples]])
            if progress is not None:
                progress(len(chunk) // num_samples)
    finally:
        model.train(was_training)
    return out


def _generation_config(tokenizer, eos, max_new_tokens, temperature, top_p, top_k, min_p, repetition_penalty,
                       generation_kwargs, do_sample, cache_implementation=None) -> GenerationConfig:
    sampling = dict(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p or None) if do_sample else {}
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, repetition_penalty=repetition_penalty,
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=eos, **sampling)
    if cache_implementation is not None:
        kwargs["cache_implementation"] = cache_implementation
    # each prompt repeated num_samples times as rows of its own, one sequence per row (as GRPOTrainer generates):
    # the same batch transformers builds for num_return_sequences, and valid under beam search (num_beams < samples)
    return GenerationConfig(**{**kwargs, **(generation_kwargs or {})}, num_return_sequences=1)


# ------------------------------------------------------------------------------------ continuous batching ---
CONTINUOUS_BATCHING_GENERATION_KWARGS = frozenset((
    "temperature", "top_k", "top_p", "min_p", "do_sample", "max_new_tokens", "eos_token_id", "pad_token_id",
    "bos_token_id", "use_cache", "cache_implementation", "disable_compile", "compile_config",
))
"""``generation_kwargs`` that transformers' continuous batching honours (or that do not change what it samples;
``cache_implementation`` is ``generate``'s: continuous batching has its own paged cache and ignores it). Its
sampler applies temperature, top-k, top-p and min-p to each sequence's last logits only; a logits processor that
needs the sequence so far (repetition penalty, minimum length, n-gram or word bans) is dropped with a log line,
and beam search or assisted decoding do not exist there."""

OWNED_BY_THE_PASS = {
    "seed": "each call is seeded by the pass (one seed per shard), so the samples do not depend on the run",
}


def engine_config(value, field: str) -> dict | None:
    """``transformers_continuous_batching_config`` as a dict: as given, or parsed from the JSON text of a command line
    (``field``, e.g. ``PresampleConfig.transformers_continuous_batching_config``, names it in the error)."""
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"{field} is not JSON ({e}): give a JSON object of ContinuousBatchingConfig arguments, "
                             """e.g. '{"max_batch_tokens": 2048}'""") from None
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"{field} must be a JSON object of ContinuousBatchingConfig arguments, got {value!r}: e.g. "
                         """'{"max_batch_tokens": 2048}'""")
    return value


def check_continuous_batching(*, repetition_penalty: float = 1.0, generation_kwargs: dict | None = None,
                              continuous_batching_config: dict | None = None, device=None,
                              flag: str = "use_transformers_continuous_batching") -> None:
    """Refuse, by name and before any model loads, what transformers' continuous batching (``generate_batch``)
    would silently drop or cannot run here: a repetition penalty, ``generation_kwargs`` outside
    :data:`CONTINUOUS_BATCHING_GENERATION_KWARGS`, a ``continuous_batching_config`` that is not
    ``ContinuousBatchingConfig``'s (or sets the seed the pass owns), and on a CPU (``device``; None: the machine has
    no CUDA / XPU device) async batching, which transformers runs on CUDA / XPU only, and a transformers older than
    5.8, which has none (TRL 1.16 requires 5.8 for it too)."""
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) < Version("5.8"):
        raise ValueError(f"{flag} needs transformers >= 5.8 (its continuous batching engine); this is transformers "
                         f"{transformers.__version__}. Upgrade it (pip install -U transformers), or set {flag}=False")
    from transformers.generation import ContinuousBatchingConfig

    if repetition_penalty != 1.0:
        raise ValueError(f"repetition_penalty={repetition_penalty} with {flag}: transformers' continuous batching "
                         "drops the repetition penalty (its sampler sees only each sequence's last token), so the "
                         f"completions would come from another distribution. Set repetition_penalty=1.0, or {flag}"
                         "=False")
    unsupported = sorted(set(generation_kwargs or {}) - CONTINUOUS_BATCHING_GENERATION_KWARGS)
    if unsupported:
        raise ValueError(f"generation_kwargs {unsupported} with {flag}: transformers' continuous batching applies "
                         "only temperature, top_k, top_p and min_p (it drops logits processors that need the whole "
                         "sequence and has no beam search), so the completions would come from another "
                         f"distribution. Remove them from generation_kwargs, or set {flag}=False")
    options = dict(continuous_batching_config or {})
    owned = sorted(k for k in options if k in OWNED_BY_THE_PASS)
    if owned:
        raise ValueError("transformers_continuous_batching_config " + "; ".join(
            f"{k!r}: {OWNED_BY_THE_PASS[k]}" for k in owned) + ". Remove it from transformers_continuous_batching_config")
    try:
        ContinuousBatchingConfig(**options)
    except TypeError as e:
        renamed = (" (this transformers calls page_size block_size: it was renamed in 5.18)"
                   if "page_size" in options and page_size_name() == "block_size" else "")
        raise ValueError(f"transformers_continuous_batching_config {sorted(options)} is not a set of "
                         f"transformers.generation.ContinuousBatchingConfig arguments ({e}){renamed}: fix or remove "
                         "the unknown keys") from None
    if device is None:  # before the model loads: a machine without CUDA / XPU generates on its CPU
        from transformers.utils import is_torch_cuda_available, is_torch_xpu_available

        device = None if is_torch_cuda_available() or is_torch_xpu_available() else "cpu"
    device_type = getattr(device, "type", device)
    if device_type == "cpu" and options.get("use_async_batching"):
        raise ValueError(f"transformers_continuous_batching_config use_async_batching=True with {flag} on a CPU: "
                         "transformers runs async batching on CUDA or XPU devices only. Remove use_async_batching "
                         "(or set it to False) on this machine")


def page_size_name() -> str:
    """The name of the KV cache's page size among ``ContinuousBatchingConfig``'s fields: ``page_size`` from
    transformers 5.18, ``block_size`` up to 5.17 (the newest transformers vLLM 0.31 allows, so what
    ``pip install "trl-variants[vllm]"`` gets); 5.18 and later still take ``block_size``, with a deprecation warning."""
    import dataclasses

    from transformers.generation import ContinuousBatchingConfig

    return "page_size" if "page_size" in {f.name for f in dataclasses.fields(ContinuousBatchingConfig)} else "block_size"


def _cpu_cache_blocks(options: dict, prompts, max_new_tokens: int) -> dict:
    """On a CPU, a cache sized for the requests of the call (all of them at once) instead of a share of the machine's
    RAM (transformers sizes it from ``max_memory_percent`` of the free memory, allocating and zeroing it on every
    call; ``max_memory_percent`` still caps it), unless ``num_blocks`` is set."""
    if options.get("num_blocks") is not None:
        return options
    from transformers.generation import ContinuousBatchingConfig

    page = options.get("page_size") or options.get("block_size") or getattr(ContinuousBatchingConfig, page_size_name())
    blocks = sum(-(-(len(p) + max_new_tokens) // page) for p in prompts)
    return {**options, "num_blocks": blocks + 1}


@torch.no_grad()
def generate_completions_continuous(
    model,
    tokenizer,
    prompt_ids: Sequence[Sequence[int]],
    num_samples: int = 1,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    generation_kwargs: dict | None = None,
    do_sample: bool = True,
    batch_size: int | None = None,
    progress=None,
    continuous_batching_config: dict | None = None,
    seed: int | None = None,
) -> list[list[list[int]]]:
    """:func:`generate_completions` through transformers' continuous batching (``model.generate_batch``, as
    GRPOTrainer with ``use_transformers_continuous_batching``): each prompt repeated ``num_samples`` times as
    requests of their own, all of them in one ``generate_batch`` call (``batch_size`` None) or ``batch_size``
    sequences per call; the engine schedules them itself (``continuous_batching_config``:
    ``ContinuousBatchingConfig`` arguments, e.g. ``max_batch_tokens``, ``num_blocks``, ``max_memory_percent``).
    Same output: per prompt ``num_samples`` completions, token ids cut after the first EOS, EOS kept, stopping at
    the same EOS ids and ``max_new_tokens``. The engine draws its random numbers in its own order (its batches are
    not ``generate``'s), so the samples are others than ``generate``'s with the same seed, drawn from the same
    distribution. ``seed`` seeds every call (``ContinuousBatchingConfig.seed``); None: from torch's global generator.
    Everything :func:`check_continuous_batching` refuses is refused here too; a request the engine failed
    (transformers logs it and returns the others) is raised."""
    from transformers.generation import ContinuousBatchingConfig

    device = next(model.parameters()).device
    check_continuous_batching(repetition_penalty=repetition_penalty, generation_kwargs=generation_kwargs,
                              continuous_batching_config=continuous_batching_config, device=device)
    eos = eos_token_ids(tokenizer, model)
    config = _generation_config(tokenizer, eos, max_new_tokens, temperature, top_p, top_k, min_p, repetition_penalty,
                                generation_kwargs, do_sample)
    rows = [list(p) for p in prompt_ids for _ in range(num_samples)]
    per_call = len(rows) if batch_size is None else max(num_samples, batch_size // num_samples * num_samples)
    if seed is None:
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
    was_training = model.training
    model.eval()
    out: list[list[list[int]]] = []
    try:
        for call, start in enumerate(range(0, len(rows), max(1, per_call))):
            chunk = rows[start : start + per_call]
            options = dict(continuous_batching_config or {})
            if device.type == "cpu":
                options = _cpu_cache_blocks(options, chunk, max_new_tokens)
            with own_forward(model):  # a trainer's model under bf16/fp16: generated in its weights' dtype
                results = model.generate_batch(
                    chunk, generation_config=config, progress_bar=False,
                    continuous_batching_config=ContinuousBatchingConfig(**options, seed=seed + call))
            gen = _generated_tokens(results, chunk)
            for i in range(len(chunk) // num_samples):
                out.append([truncate_after_eos(list(g), eos) for g in gen[i * num_samples : (i + 1) * num_samples]])
            if progress is not None:
                progress(len(chunk) // num_samples)
    finally:
        model.train(was_training)
    return out


@contextmanager
def own_forward(model):
    """``model``'s own forward instead of the one Accelerate's mixed precision wraps it in (autocast, outputs
    converted to float32), for as long as the block runs. Continuous batching cannot run under that wrapper: its
    paged KV cache takes the weights' dtype while autocast hands it bf16 keys and values (float32 weights:
    ``index_copy_(): self and source expected to have the same dtype``), and the output conversion calls ``.float()``
    on the cache (bf16 weights: ``'PagedAttentionCache' object has no attribute 'float'``). Either way the engine logs
    the error and fails every request."""
    wrapped, own = vars(model).get("forward"), vars(model).get("_original_forward")
    if wrapped is None or own is None:
        yield
        return
    model.forward = own
    try:
        yield
    finally:
        model.forward = wrapped


# what to do when the engine failed requests (said here and by the trainers' continuous-batching rollout)
CACHE_TOO_SMALL = ("If the KV cache is too small for a request (prompt + max_completion_length tokens), raise "
                   "num_blocks or max_memory_percent in transformers_continuous_batching_config")


def _generated_tokens(results: dict, requests: list[list[int]]) -> list[list[int]]:
    """The tokens ``generate_batch`` generated for each request, in request order; a missing or failed request
    (transformers logs those and returns the rest) is raised, naming the engine's error."""
    outputs = list(results.values())
    failed = [o.error for o in outputs if o.error is not None]
    if len(outputs) != len(requests) or failed:
        # a failed request: its error; a missing one (transformers 5.10 drops it, 5.17 and 5.24 return its error)
        hint = f": {failed[0]}" if failed else " (the engine dropped the others; ContinuousBatchingLogger logged why)"
        raise RuntimeError(f"transformers' continuous batching returned {len(outputs) - len(failed)} of "
                           f"{len(requests)} completions{hint}. {CACHE_TOO_SMALL}")
    if any(list(o.prompt_ids) != r for o, r in zip(outputs, requests, strict=True)):
        raise RuntimeError("transformers' continuous batching returned its completions out of the request order")
    return [list(o.generated_tokens) for o in outputs]
