"""transformers as the offline pass's generator (the default): ``generate``, or transformers' continuous batching
(``generate_batch``), or ``generate`` with another KV cache, as GRPOConfig's options of those names choose. A
generator's interface is described in :mod:`~trl_variants.presample.vllm_backend` (the vLLM engines)."""

from __future__ import annotations

import os

import torch

from ..generation import generate_completions
from .config import PresampleConfig


class HFGenerator:
    """transformers ``generate`` (the default generator): a shard is sampled after ``torch.manual_seed(shard_seed)``
    in batches of ``generation_batch_size`` sequences, so its samples are a function of (seed, shard, layout).

    ``continuous_batching``: a shard is one ``model.generate_batch`` call instead (transformers' continuous batching,
    GRPOConfig's ``use_transformers_continuous_batching``), its engine seeded from the shard seed, sized by
    ``continuous_batching_config`` (``ContinuousBatchingConfig`` arguments): its samples are a function of (seed,
    shard, engine options). ``cache_implementation``: the KV cache ``generate`` uses (GRPOConfig's). Unset (None),
    each is taken from the pass's :class:`PresampleConfig` (``config``, or the one :meth:`generate` gets): a
    trainer's generator sets them from the trainer's options. ``name`` says which (:func:`hf_generator_name`), and is
    part of the cache key. ``model`` / ``tokenizer`` None: the pass's own (:meth:`bound`)."""

    def __init__(self, model=None, tokenizer=None, config: PresampleConfig | None = None, *,
                 continuous_batching: bool | None = None, continuous_batching_config: dict | None = None,
                 cache_implementation: str | None = None):
        self.model, self.tokenizer = model, tokenizer
        if config is not None:
            continuous_batching = (config.use_transformers_continuous_batching if continuous_batching is None
                                   else continuous_batching)
            continuous_batching_config = continuous_batching_config or config.transformers_continuous_batching_config
            cache_implementation = cache_implementation or config.cache_implementation
        self.continuous_batching = bool(continuous_batching)
        self.continuous_batching_config = dict(continuous_batching_config or {}) if self.continuous_batching else None
        self.cache_implementation = None if self.continuous_batching else cache_implementation
        self.name = hf_generator_name(self.continuous_batching, self.continuous_batching_config,
                                      self.cache_implementation)

    def bound(self, model, tokenizer, config: PresampleConfig) -> HFGenerator:
        """This generator on the pass's model and tokenizer where it has none, with the pass's engine options
        where it sets none."""
        return HFGenerator(self.model if self.model is not None else model,
                           self.tokenizer if self.tokenizer is not None else tokenizer, config,
                           continuous_batching=self.continuous_batching or None,
                           continuous_batching_config=self.continuous_batching_config,
                           cache_implementation=self.cache_implementation)

    def prepare(self):
        pass

    def finish(self):
        pass

    def generate(self, prompt_ids, rows, config: PresampleConfig, shard_seed: int):
        torch.manual_seed(shard_seed)
        engine = {}
        if self.continuous_batching:
            engine = dict(continuous_batching=True, continuous_batching_config=self.continuous_batching_config)
        elif self.cache_implementation is not None:
            engine = dict(cache_implementation=self.cache_implementation)
        return generate_completions(
            self.model, self.tokenizer, prompt_ids, config.num_samples, max_new_tokens=config.max_completion_length,
            temperature=config.temperature, top_p=config.top_p, top_k=config.top_k, min_p=config.min_p,
            repetition_penalty=config.repetition_penalty, generation_kwargs=config.generation_kwargs,
            batch_size=config.generation_batch_size, do_sample=not config.greedy, **engine,
        )


def hf_generator_name(continuous_batching: bool = False, continuous_batching_config: dict | None = None,
                      cache_implementation: str | None = None) -> str:
    """What the transformers generator runs, as the pass reports it and keys its cache: ``"hf"`` (``generate``),
    ``"hf-continuous-batching"`` plus its engine options (``generate_batch``), or ``"hf-cache=<implementation>"``."""
    if continuous_batching:
        import json

        options = json.dumps(continuous_batching_config, sort_keys=True) if continuous_batching_config else ""
        return "hf-continuous-batching" + (f" {options}" if options else "")
    if cache_implementation is not None:
        return f"hf-cache={cache_implementation}"
    return "hf"


def check_hf_engine(generator: HFGenerator, config: PresampleConfig, model, accelerator=None) -> None:
    """What transformers' continuous batching would drop or cannot run on this process's device, refused before the
    model loads (a trainer's generator sets the option without the pass's config having checked it)."""
    if not generator.continuous_batching:
        return
    from ..generation import check_continuous_batching

    if accelerator is not None:
        device = accelerator.device
    elif isinstance(model, str | os.PathLike):
        device = torch.device("cpu")  # loaded on the CPU
    else:
        device = next(model.parameters()).device
    check_continuous_batching(repetition_penalty=config.repetition_penalty,
                              generation_kwargs=config.generation_kwargs,
                              continuous_batching_config=generator.continuous_batching_config,
                              device=device)
