"""The pass itself: shard the prompts, generate, score, cache each shard, merge in order (:func:`presample`)."""

from __future__ import annotations

import functools
import logging
import math
import os
import shutil
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from .._validation import (
    check_model_paths,
    check_reward_column_values,
    check_reward_columns,
    check_train_dataset,
    checked_reward_funcs,
    ensure_pad_token,
)
from ..generation import tokenize_prompts
from . import vllm_backend
from .cache import atomic_write_json, cache_key, default_cache_dir, read_shard
from .config import COLUMNS, REF_PROMPT_LOGP, PresampleConfig
from .hf_backend import HFGenerator, check_hf_engine
from .logprobs import check_prompt_lengths, completion_token_logps, prompt_logps_from_ids
from .metadata import summarize, with_metadata
from .random_state import preserved_random_state
from .reward_calls import reward_fingerprint, reward_name, score_completions
from .summaries import requested
from .vllm_backend import (
    ServerGenerator,
    VLLMGenerator,
    check_vllm_options,
    offline_generator,
    timed,
    vllm_version,
)

logger = logging.getLogger(__name__)


def _resolve_backend(config: PresampleConfig, model) -> str:
    """``"hf"`` or ``"vllm"`` for a pass without a trainer's generator (decided before the model loads)."""
    if config.backend == "hf":
        return "hf"
    by_path = isinstance(model, str | os.PathLike)
    if config.backend == "vllm":
        vllm_backend.check_vllm_setup(config)
        if not by_path:
            raise ValueError("backend='vllm' needs the model as a path or Hub id: vLLM loads its own copy of the "
                             "weights, which could differ from the model object passed (and from the cache key). "
                             "Pass model=<path>, or use backend='hf'; a trainer with use_vllm=True uses its own "
                             "engine")
    return "vllm" if by_path and vllm_backend.vllm_usable() else "hf"


def sample_shard(rows, prompt_ids, row_indices, shard_index, model, tokenizer, config, generator,
                 token_logps_fn=None):
    """Sample one shard of the pass as :func:`presample` does, and score its log-probs when ``config`` asks.

    ``rows``: the shard's dataset rows (a list of dicts); ``prompt_ids``: their prompts tokenized as GRPOTrainer
    does (:func:`~trl_variants.generation.tokenize_prompts`); ``row_indices``: their row numbers in the dataset;
    ``shard_index``: seeds the shard (``config.seed * 1_000_003 + shard_index``), so its samples do not depend on
    interruptions or on the number of processes; ``generator``: what samples (:class:`HFGenerator` or a vLLM
    generator of :mod:`~trl_variants.presample.vllm_backend`), ``config`` a :class:`PresampleConfig`. Returns
    ``(out, seconds, tokens)``: one dict per prompt (``ref_prompt_ids``, and ``ref_completion_ids`` /
    ``ref_completions`` with ``config.num_samples`` samples, ``REF_PROMPT_LOGP`` / ``ref_completion_logps`` when
    recorded), the seconds spent generating and the tokens generated. Rewards come after (:func:`score_shard`)."""
    out = [{"ref_prompt_ids": ids} for ids in prompt_ids]
    if config.record_prompt_logp:
        logps = prompt_logps_from_ids(model, prompt_ids, tokenizer.pad_token_id, config.temperature,
                                      config.logprob_batch_size, token_logps_fn)
        for o, v in zip(out, logps.tolist(), strict=True):
            o[REF_PROMPT_LOGP] = v
    if config.num_samples == 0:
        return out, 0.0, 0
    seed = config.seed * 1_000_003 + shard_index
    samples, seconds, tokens = timed(generator.generate, prompt_ids, row_indices, config, seed)
    n = config.num_samples
    if len(samples) != len(prompt_ids) or any(len(s) != n for s in samples):
        raise RuntimeError(f"the {generator.name} generator returned {[len(s) for s in samples]} completions for "
                           f"{len(prompt_ids)} prompts x {n} samples")
    texts = tokenizer.batch_decode([c for per_prompt in samples for c in per_prompt], skip_special_tokens=True)
    for i, o in enumerate(out):
        o["ref_completion_ids"] = samples[i]
        o["ref_completions"] = texts[i * n : (i + 1) * n]
        if config.record_completion_logps:
            o["ref_completion_logps"] = completion_token_logps(
                model, prompt_ids[i], samples[i], config.temperature, config.logprob_batch_size,
                tokenizer.pad_token_id, token_logps_fn)
    return out, seconds, tokens


def score_shard(out, rows, config, reward_funcs, reward_weights, trainer_state=None) -> int:
    """Score the completions of a shard sampled by :func:`sample_shard` in place, calling ``reward_funcs`` with
    GRPOTrainer's reward signature (the rows' other columns as keyword arguments): each prompt's ``ref_rewards`` (the
    ``reward_weights``-weighted sum), ``ref_rewards_per_func`` (one value per function, NaN where it gave none) and
    the summaries of the rewards ``config`` asks for (:mod:`.summaries`: ``ref_value`` with ``value_beta``). Returns
    how many completions got no reward from any function."""
    summaries = requested(config)
    n = config.num_samples
    conversational = isinstance(rows[0]["prompt"], list)
    texts = [t for o in out for t in o["ref_completions"]]
    completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
    columns = {k: [r[k] for r in rows for _ in range(n)] for k in rows[0] if k != "prompt"}
    total, per_func = score_completions(
        reward_funcs, reward_weights, [r["prompt"] for r in rows for _ in range(n)], completions,
        [c for o in out for c in o["ref_completion_ids"]], columns, trainer_state)
    for i, o in enumerate(out):
        o["ref_rewards"] = total[i * n : (i + 1) * n]
        o["ref_rewards_per_func"] = per_func[i * n : (i + 1) * n]
        finite = [r for r in o["ref_rewards"] if not math.isnan(r)]  # a completion without a reward is left out
        for summary, parameter in summaries:
            o[summary.column] = summary.compute(finite, parameter) if finite else math.nan
    return sum(math.isnan(r) for r in total)


def _record_throughput(dataset, backend: str, tokens: int, seconds: float) -> dict:
    """Add what generated and how fast (this call's generation only: cached shards cost nothing) to the metadata
    in the dataset's info (``generation``: backend, generated_tokens, generation_seconds, tokens_per_s)."""
    import json

    from .config import METADATA_KEY

    record = {"backend": backend, "generated_tokens": tokens, "generation_seconds": round(seconds, 3),
              "tokens_per_s": tokens / seconds if seconds > 0 else None}
    info = json.loads(dataset.info.description)
    info[METADATA_KEY]["generation"] = record
    dataset.info.description = json.dumps(info)
    return record


def shard_rows(shard: int, shard_size: int, num_rows: int) -> range:
    """The dataset rows of one shard of the pass."""
    return range(shard * shard_size, min(num_rows, (shard + 1) * shard_size))


def _shard_rows(shards, config: PresampleConfig, num_rows: int) -> list[int]:
    return [r for s in sorted(shards) for r in shard_rows(s, config.shard_size, num_rows)]


def _keeps_random_state(pass_fn):
    """``pass_fn`` run inside :func:`~trl_variants.presample.random_state.preserved_random_state`."""
    @functools.wraps(pass_fn)
    def run(*args, **kwargs):
        with preserved_random_state():
            return pass_fn(*args, **kwargs)

    return run


@_keeps_random_state
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
    generator=None,
    trainer_state=None,
    shards: Sequence[int] | None = None,
):
    """Run the offline reference pass and return ``dataset`` with the :data:`COLUMNS` it records.

    The pass seeds torch per shard when it samples and draws nothing when it reads its cache: it leaves the random
    state (torch CPU and CUDA, python ``random``, numpy) exactly as it found it, so whatever runs after it (a
    trainer's rollouts) does not depend on whether it was computed, read from the cache or run lazily.

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
        generator: what samples the completions (see :mod:`~trl_variants.presample.vllm_backend`); None = from
            ``config.backend``: :class:`HFGenerator` (with ``config``'s continuous batching / KV cache options) or an
            offline vLLM engine. A trainer with ``use_vllm=True`` passes its own engine, one with
            ``use_transformers_continuous_batching`` or ``cache_implementation`` an :class:`HFGenerator` with them
            (:func:`~trl_variants.presample.vllm_backend.trainer_generator`). Everything else
            (prompt ids, shards, cache, resume, rewards, reference log-probs by the transformers model) is the same.
        trainer_state: given to the reward functions as ``trainer_state`` (a trainer passes its ``state``).
        shards: only these shards of the pass over the whole ``dataset`` (shard ``s`` holds rows
            ``s * shard_size`` to ``(s + 1) * shard_size - 1``; processed in the order given, shared round robin between
            processes): the rows of these shards are returned, in dataset order, with the columns. Each shard is the
            very computation the full pass makes (same seed, same batches, same cache key and shard file), so its values
            are the full pass's, and shards of either are reused by the other. A partial pass does not store the final
            dataset. Used by A*-PO's lazy stage 1 (``APOConfig.lazy_value_pass``).
    """
    from accelerate.utils import gather_object
    from tqdm.auto import tqdm

    config = config or PresampleConfig()
    reward_funcs = [reward_funcs] if callable(reward_funcs) else list(reward_funcs)
    reward_funcs = checked_reward_funcs(reward_funcs)  # as in the trainers: a NaN reward is said once per function
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
    if config.num_samples > 0:  # the reward functions are called: no None in a column one of them requires
        check_reward_column_values(reward_funcs, dataset, "presample")
    backend = "hf"
    if config.num_samples > 0:
        backend = generator.name if generator is not None else _resolve_backend(config, model)
        if backend == "vllm" or isinstance(generator, VLLMGenerator | ServerGenerator):
            check_vllm_options(config)  # options vLLM cannot honour, refused before the model loads
        hf_engine = config.use_transformers_continuous_batching or config.cache_implementation is not None
        if isinstance(generator, VLLMGenerator | ServerGenerator) and hf_engine:
            raise ValueError("use_transformers_continuous_batching / cache_implementation are transformers generation "
                             f"options, but the pass generates with {generator.name}: leave them unset")
        if backend == "hf" or isinstance(generator, HFGenerator):
            # the generator (its name keys the cache): the pass's, or a trainer's, on the pass's model
            generator = (generator or HFGenerator()).bound(None, None, config)
            backend = generator.name
            check_hf_engine(generator, config, model, accelerator)  # e.g. async batching on a CPU, before loading
    clash = [c for c in COLUMNS if c in dataset.column_names]
    if clash:
        raise ValueError(f"the dataset already has presample columns {clash}: it was presampled already (pass it "
                         "to the trainer as is), or remove those columns first")
    # last of the checks (the option checks above name a bad option even with a wrong path), before anything loads
    check_model_paths(model, [], "presample")  # a path that does not exist, a Hub id offline and not cached
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
    if backend == "vllm":
        backend = f"vllm=={vllm_version()}"
    key = cache_key(model, tokenizer, dataset, config, reward_funcs, reward_weights, prompt_ids=all_prompt_ids,
                    backend=backend)
    # Rewards of a function that cannot be fingerprinted (a lambda, a closure, a model) are never trusted from disk.
    rescore = config.num_samples > 0 and any(reward_fingerprint(f) is None for f in reward_funcs)
    root = Path(config.cache_dir) if config.cache_dir else default_cache_dir()
    run_dir = root / key
    final = run_dir / "dataset"
    cached_ds = None
    if config.use_cache and not rescore and (final / "state.json").exists():
        from datasets import load_from_disk

        try:
            cached_ds = load_from_disk(str(final))
            cached_ds.data.validate()  # load_from_disk reads every record batch's header: a truncated file fails here
        except Exception as e:  # a truncated / corrupted arrow file: recompute it (the shards may still serve)
            cached_ds = None
            warnings.warn(f"presample: the cached dataset {final} is damaged ({type(e).__name__}: {e}); recomputing "
                          "it; the cache entry is overwritten", stacklevel=2)
    # all processes return the cached result or none: the pass below has collectives, and a cache local to each node
    # may hold the result on some nodes only
    if world > 1 and not all(gather_object([cached_ds is not None])):
        cached_ds = None
    if cached_ds is not None:
        logger.info("presample: cache hit %s", final)
        return cached_ds if shards is None else cached_ds.select(_shard_rows(shards, config, len(dataset)))

    n_shards = math.ceil(len(dataset) / config.shard_size)
    wanted = list(range(n_shards)) if shards is None else list(shards)
    if not wanted or len(set(wanted)) != len(wanted) or any(not 0 <= s < n_shards for s in wanted):
        raise ValueError(f"shards must be distinct shard indices in [0, {n_shards}), got {wanted}")
    mine = wanted[rank::world]  # round robin: every process gets shards from start to end

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
            unrewarded += score_shard(out, list(dataset.select(shard_range(s))), config, reward_funcs,
                                       reward_weights, trainer_state)

    if isinstance(generator, HFGenerator):
        generator = generator.bound(model, tokenizer, config)
    if config.num_samples > 0 and generator is None:
        if todo or world > 1:  # an engine is expensive to start: not for a finished pass (processes start together)
            generator = offline_generator(model, tokenizer, config, accelerator)
    bar = tqdm(total=sum(len(shard_range(s)) for s in todo), desc="presample", unit="prompt",
               disable=rank != 0 or not config.show_progress)
    gen_seconds, gen_tokens = 0.0, 0
    try:
        if generator is not None:
            generator.prepare()  # on every process, before any shard (weight pushes are collectives)
        for s in todo:
            rows = list(dataset.select(shard_range(s)))
            with torch.no_grad():
                out, seconds, tokens = sample_shard(
                    rows, [all_prompt_ids[i] for i in shard_range(s)], list(shard_range(s)), s, model, tokenizer,
                    config, generator, token_logps_fn)
            gen_seconds, gen_tokens = gen_seconds + seconds, gen_tokens + tokens
            if config.num_samples > 0:
                unrewarded += score_shard(out, rows, config, reward_funcs, reward_weights, trainer_state)
            if config.use_cache:
                atomic_write_json(run_dir / f"shard-{s:06d}.json", {"shard": s, "rows": out})
            results.append((s, out))
            bar.update(len(out))
            if gen_seconds > 0:
                bar.set_postfix(tokens_per_s=f"{gen_tokens / gen_seconds:.1f}")
    finally:
        bar.close()
        if generator is not None:
            generator.finish()

    if world > 1:
        results = gather_object(results)
        unrewarded = sum(gather_object([unrewarded]))
        gen_tokens = sum(gather_object([gen_tokens]))
        gen_seconds = max(gather_object([gen_seconds]))  # the processes generate at the same time
    if unrewarded and rank == 0:
        warnings.warn(f"presample: {unrewarded} completions got no reward (every reward function returned None or "
                      "NaN): they are stored with reward NaN, left out of V_hat and never counted as correct",
                      stacklevel=2)
    results.sort(key=lambda r: r[0])
    new_rows = [row for _, rows in results for row in rows]
    partial = sorted(wanted) != list(range(n_shards))
    out_ds = dataset.select(_shard_rows(wanted, config, len(dataset))) if partial else dataset
    if len(new_rows) != len(out_ds) or [s for s, _ in results] != sorted(wanted):
        raise RuntimeError(f"presample merged {len(new_rows)} rows from shards {[s for s, _ in results]} for "
                           f"{len(out_ds)} rows: shards are missing or duplicated")
    for col in new_rows[0]:
        out_ds = out_ds.add_column(col, [r[col] for r in new_rows])
    out_ds = with_metadata(out_ds, config, key, [reward_name(f) for f in reward_funcs], model=model)
    throughput = _record_throughput(out_ds, backend, gen_tokens, gen_seconds)
    if rank == 0 and throughput["generated_tokens"]:
        message = (f"presample: {backend} generated {gen_tokens} tokens in {gen_seconds:.1f} s "
                   f"({throughput['tokens_per_s']:.1f} tokens/s)")
        logger.info(message)
        if config.show_progress:
            print(message)
    summary = summarize(out_ds)
    if rank == 0 and config.show_progress and summary:
        print("presample summary: " + ", ".join(f"{k} {v:.4g}" for k, v in summary.items()))
    if config.use_cache and not rescore and rank == 0 and not partial:
        tmp = run_dir / f".dataset-tmp-{os.getpid()}"
        out_ds.save_to_disk(str(tmp))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    if world > 1 and accelerator is not None:
        accelerator.wait_for_everyone()
    return out_ds
