"""The pass itself: shard the prompts, generate, score, cache each shard, merge in order (:func:`presample`)."""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from .._validation import check_train_dataset, ensure_pad_token
from ..generation import generate_completions, tokenize_prompts
from .cache import atomic_write_json, cache_key, default_cache_dir, read_shard
from .config import COLUMNS, REF_PROMPT_LOGP, PresampleConfig
from .logprobs import check_prompt_lengths, completion_token_logps, prompt_logps_from_ids
from .metadata import summarize, with_metadata
from .reward_calls import check_reward_columns, reward_fingerprint, reward_name, score_completions

logger = logging.getLogger(__name__)


def _generate_vllm(llm, prompt_ids, config: PresampleConfig, shard_seed: int, eos_ids):  # pragma: no cover - GPU
    from vllm import SamplingParams

    from ..generation import truncate_after_eos

    temperature = 0.0 if config.greedy else config.temperature  # vLLM decodes greedily at temperature 0
    params = SamplingParams(n=config.num_samples, temperature=temperature, top_p=config.top_p,
                            top_k=config.top_k if config.top_k > 0 else -1, max_tokens=config.max_completion_length,
                            seed=shard_seed)
    outs = llm.generate([{"prompt_token_ids": list(p)} for p in prompt_ids], params, use_tqdm=False)
    return [[truncate_after_eos(list(o.token_ids), eos_ids) for o in out.outputs] for out in outs]


def _resolve_backend(config: PresampleConfig) -> str:
    if config.backend == "hf":
        return "hf"
    from transformers.utils import is_torch_cuda_available

    try:
        import vllm  # noqa: F401

        have_vllm = True
    except ImportError:
        have_vllm = False
    if config.backend == "vllm" and not (have_vllm and is_torch_cuda_available()):
        raise RuntimeError("backend='vllm' needs the vllm package and a CUDA GPU: pip install 'trl-variants[vllm]', "
                           "or use backend='hf'")
    return "vllm" if have_vllm and is_torch_cuda_available() else "hf"


def _process_shard(rows, prompt_ids, shard_index, model, tokenizer, config, vllm_llm, token_logps_fn=None):
    """Sample and score (log-probs) one shard of dataset rows (a list of dicts); rewards come after
    (:func:`_add_rewards`)."""
    from ..generation import eos_token_ids

    out = [{"ref_prompt_ids": ids} for ids in prompt_ids]
    if config.record_prompt_logp:
        logps = prompt_logps_from_ids(model, prompt_ids, tokenizer.pad_token_id, config.temperature,
                                      config.logprob_batch_size, token_logps_fn)
        for o, v in zip(out, logps.tolist(), strict=True):
            o[REF_PROMPT_LOGP] = v
    if config.num_samples == 0:
        return out
    seed = config.seed * 1_000_003 + shard_index
    if vllm_llm is not None:
        samples = _generate_vllm(vllm_llm, prompt_ids, config, seed, eos_token_ids(tokenizer, model))
    else:
        torch.manual_seed(seed)
        samples = generate_completions(
            model, tokenizer, prompt_ids, config.num_samples, max_new_tokens=config.max_completion_length,
            temperature=config.temperature, top_p=config.top_p, top_k=config.top_k, min_p=config.min_p,
            repetition_penalty=config.repetition_penalty, generation_kwargs=config.generation_kwargs,
            batch_size=config.generation_batch_size, do_sample=not config.greedy,
        )
    n = config.num_samples
    texts = tokenizer.batch_decode([c for per_prompt in samples for c in per_prompt], skip_special_tokens=True)
    for i, o in enumerate(out):
        o["ref_completion_ids"] = samples[i]
        o["ref_completions"] = texts[i * n : (i + 1) * n]
        if config.record_completion_logps:
            o["ref_completion_logps"] = completion_token_logps(
                model, prompt_ids[i], samples[i], config.temperature, config.logprob_batch_size,
                tokenizer.pad_token_id, token_logps_fn)
    return out


def _add_rewards(out, rows, config, reward_funcs, reward_weights) -> int:
    """Score the completions of a shard in place (``ref_rewards``, ``ref_rewards_per_func``, ``ref_value``) with
    GRPOTrainer's reward signature; return how many completions got no reward from any function."""
    from ..losses import optimal_value

    n = config.num_samples
    conversational = isinstance(rows[0]["prompt"], list)
    texts = [t for o in out for t in o["ref_completions"]]
    completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
    columns = {k: [r[k] for r in rows for _ in range(n)] for k in rows[0] if k != "prompt"}
    total, per_func = score_completions(
        reward_funcs, reward_weights, [r["prompt"] for r in rows for _ in range(n)], completions,
        [c for o in out for c in o["ref_completion_ids"]], columns)
    for i, o in enumerate(out):
        o["ref_rewards"] = total[i * n : (i + 1) * n]
        o["ref_rewards_per_func"] = per_func[i * n : (i + 1) * n]
        if config.value_beta is not None:  # V_hat over the completions that have a reward (NaN if none has)
            finite = torch.tensor([r for r in o["ref_rewards"] if not math.isnan(r)], dtype=torch.float64)
            o["ref_value"] = float(optimal_value(finite, config.value_beta)) if finite.numel() else math.nan
    return sum(math.isnan(r) for r in total)


def presample(
    model,
    tokenizer,
    dataset,
    reward_funcs: Callable | Sequence[Callable] = (),
    config: PresampleConfig | None = None,
    *,
    reward_weights: Sequence[float] | None = None,
    accelerator=None,
    token_logps_fn=None,
    tokenize_fn=None,
):
    """Run the offline reference pass and return ``dataset`` with the :data:`COLUMNS` it records.

    Args:
        model: the frozen reference policy: a model object, or a path / Hub id loaded with ``AutoModelForCausalLM``.
        tokenizer: its tokenizer (None: loaded from ``model`` when that is a path).
        dataset: a ``datasets.Dataset`` with a ``prompt`` column (plain or conversational) plus the columns the
            reward functions read.
        reward_funcs: TRL-signature reward callables (required when ``config.num_samples > 0``).
        config: :class:`PresampleConfig`.
        reward_weights: one weight per reward function (default all 1).
        accelerator: an ``accelerate.Accelerator`` (or ``PartialState``) to split the shards between processes;
            every process returns the full, ordered dataset.
        token_logps_fn: ``(input_ids, attention_mask) -> (B, L - 1)`` log-probs replacing the plain forward (a
            trainer passes its fused, temperature-scaled scorer so stored and online log-probs share a kernel).
        tokenize_fn: ``prompts -> list of token-id lists`` replacing :func:`~trl_variants.generation.tokenize_prompts`
            (a trainer passes its own prompt tokenization, so the stored ids are exactly the ones it trains on:
            its chat template, ``chat_template_kwargs`` and tools included).
    """
    from accelerate.utils import gather_object
    from tqdm.auto import tqdm

    config = config or PresampleConfig()
    reward_funcs = [reward_funcs] if callable(reward_funcs) else list(reward_funcs)
    reward_weights = [1.0] * len(reward_funcs) if reward_weights is None else list(reward_weights)
    # --- every check before any expensive work ---
    check_train_dataset(dataset, "presample", split="dataset")  # a prompt column, no empty prompt
    if len(dataset) == 0:
        raise ValueError("the dataset is empty")
    if config.num_samples > 0 and not reward_funcs:
        raise ValueError("num_samples > 0 needs at least one reward function (reward_funcs=[...])")
    if len(reward_weights) != len(reward_funcs):
        raise ValueError(f"reward_weights has {len(reward_weights)} entries for {len(reward_funcs)} reward functions")
    check_reward_columns(reward_funcs, dataset.column_names)
    clash = [c for c in COLUMNS if c in dataset.column_names]
    if clash:
        raise ValueError(f"the dataset already has presample columns {clash}: it was presampled already (pass it "
                         "to the trainer as is), or remove those columns first")
    if isinstance(model, str | os.PathLike):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = str(model)
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(path, padding_side="left", truncation_side="left")
        model = AutoModelForCausalLM.from_pretrained(path, dtype="auto")
        if accelerator is not None:
            model = model.to(accelerator.device)
    if tokenizer is None:
        raise ValueError("tokenizer is required when model is a model object")
    ensure_pad_token(tokenizer)  # as GRPOTrainer: no pad token (Llama 3, Mistral) pads with EOS

    prompts = list(dataset["prompt"])
    if tokenize_fn is not None:
        all_prompt_ids = [list(ids) for ids in tokenize_fn(prompts)]
    else:
        all_prompt_ids = tokenize_prompts(tokenizer, prompts, config.max_prompt_length, config.chat_template_kwargs)
    check_prompt_lengths(all_prompt_ids, minimum=2 if config.record_prompt_logp else 1)

    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    backend = _resolve_backend(config) if config.num_samples > 0 else "hf"
    key = cache_key(model, tokenizer, dataset, config, reward_funcs, reward_weights, prompt_ids=all_prompt_ids,
                    backend=backend)
    # Rewards of a function that cannot be fingerprinted (a lambda, a closure, a model) are never trusted from disk.
    rescore = config.num_samples > 0 and any(reward_fingerprint(f) is None for f in reward_funcs)
    root = Path(config.cache_dir) if config.cache_dir else default_cache_dir()
    run_dir = root / key
    final = run_dir / "dataset"
    if config.use_cache and not rescore and (final / "state.json").exists():
        from datasets import load_from_disk

        logger.info("presample: cache hit %s", final)
        try:
            cached_ds = load_from_disk(str(final))
            cached_ds.data.validate()  # load_from_disk reads every record batch's header: a truncated file fails here
            return cached_ds
        except Exception as e:  # a truncated / corrupted arrow file: recompute it (the shards may still serve)
            warnings.warn(f"presample: the cached dataset {final} is damaged ({type(e).__name__}: {e}); recomputing "
                          "it; the cache entry is overwritten", stacklevel=2)

    vllm_llm = None
    if backend == "vllm":  # pragma: no cover - GPU only
        from vllm import LLM

        vllm_llm = LLM(model=model.config._name_or_path, seed=config.seed)
    n_shards = math.ceil(len(dataset) / config.shard_size)
    mine = list(range(rank, n_shards, world))  # round robin: every process gets shards from start to end

    def shard_range(s):
        return range(s * config.shard_size, min(len(dataset), (s + 1) * config.shard_size))

    results: list[tuple[int, list[dict]]] = []
    todo = []
    for s in mine:
        cached = read_shard(run_dir / f"shard-{s:06d}.json", len(shard_range(s))) if config.use_cache else None
        (results.append((s, cached["rows"])) if cached else todo.append(s))
    if config.use_cache:
        atomic_write_json(run_dir / "options.json", {"key": key, "options": config.key_options(),
                                                     "rows": len(dataset), "shards": n_shards})
    unrewarded = 0
    if rescore:
        for s, out in results:
            unrewarded += _add_rewards(out, list(dataset.select(shard_range(s))), config, reward_funcs,
                                       reward_weights)

    bar = tqdm(total=sum(len(shard_range(s)) for s in todo), desc="presample", unit="prompt",
               disable=rank != 0 or not config.show_progress)
    start_t, n_samples = time.perf_counter(), 0
    for s in todo:
        rows = list(dataset.select(shard_range(s)))
        with torch.no_grad():
            out = _process_shard(rows, [all_prompt_ids[i] for i in shard_range(s)], s, model, tokenizer, config,
                                 vllm_llm, token_logps_fn)
        if config.num_samples > 0:
            unrewarded += _add_rewards(out, rows, config, reward_funcs, reward_weights)
        if config.use_cache:
            atomic_write_json(run_dir / f"shard-{s:06d}.json", {"shard": s, "rows": out})
        results.append((s, out))
        n_samples += len(out) * max(1, config.num_samples)
        bar.update(len(out))
        bar.set_postfix(samples_per_s=f"{n_samples / max(1e-9, time.perf_counter() - start_t):.1f}")
    bar.close()

    if world > 1:
        results = gather_object(results)
        unrewarded = sum(gather_object([unrewarded]))
    if unrewarded and rank == 0:
        warnings.warn(f"presample: {unrewarded} completions got no reward (every reward function returned None or "
                      "NaN): they are stored with reward NaN, left out of V_hat and never counted as correct",
                      stacklevel=2)
    results.sort(key=lambda r: r[0])
    new_rows = [row for _, rows in results for row in rows]
    if len(new_rows) != len(dataset) or [s for s, _ in results] != list(range(n_shards)):
        raise RuntimeError(f"presample merged {len(new_rows)} rows from shards {[s for s, _ in results]} for a "
                           f"dataset of {len(dataset)} rows: shards are missing or duplicated")
    out_ds = dataset
    for col in new_rows[0]:
        out_ds = out_ds.add_column(col, [r[col] for r in new_rows])
    out_ds = with_metadata(out_ds, config, key, [reward_name(f) for f in reward_funcs])
    summary = summarize(out_ds)
    if rank == 0 and config.show_progress and summary:
        print("presample summary: " + ", ".join(f"{k} {v:.4g}" for k, v in summary.items()))
    if config.use_cache and not rescore and rank == 0:
        tmp = run_dir / f".dataset-tmp-{os.getpid()}"
        out_ds.save_to_disk(str(tmp))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    if world > 1 and accelerator is not None:
        accelerator.wait_for_everyone()
    return out_ds
