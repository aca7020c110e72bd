"""Options of the offline reference pass and the columns it records."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .._validation import check_cache_dir

REF_PROMPT_LOGP = "ref_prompt_logp"
COLUMNS = {
    "ref_prompt_ids": "prompt token ids exactly as GRPOTrainer feeds them (list[int])",
    "ref_completion_ids": "N sampled completions, token ids cut after the first EOS (list[list[int]])",
    "ref_completions": "the same completions as text (list[str])",
    "ref_rewards": "reward of each completion, weighted sum over the reward functions; NaN where every function "
    "returned None or NaN (the completion is then left out of V_hat and never counts as correct) (list[float])",
    "ref_rewards_per_func": "each reward function's own value for each completion, NaN for None (list[list[float]]: "
    "completion x function, in the order of the metadata's reward_funcs)",
    "ref_completion_logps": "per-token reference log-probs of each completion, at the sampling temperature "
    "(list[list[float]]; only with record_completion_logps)",
    "ref_prompt_logp": "l_ref(s): sum of the prompt's token log-probs, first token skipped (float; record_prompt_logp)",
    "ref_value": "V_hat(x) = beta * log mean exp(r / beta) over the N rewards (float; only with value_beta; A*-PO's "
    "eq. 1, declared in trl_variants/apo/value.py)",
    "ref_presample_info": "how the pass was made: options, cache key, reward function names (a JSON string, the same "
    "in every row; trainers check it against their own options)",
}
"""Columns :func:`presample` adds, and what they hold."""

METADATA_KEY = "trl_variants_presample"
METADATA_COLUMN = "ref_presample_info"


@dataclass
class PresampleConfig:
    """Options of the offline reference pass. Every field that changes the result is part of the cache key.

    Parameters:
        num_samples: completions per prompt (A*-PO's N, DPH-RL's k); 0 records only prompt log-likelihoods (ERPO).
        greedy: decode greedily instead of sampling (needs num_samples 1; used by evaluation).
        temperature, top_p, top_k, min_p, repetition_penalty: sampling parameters (top_k 0 = off, min_p 0 = off),
            as GRPOConfig's. Log-probs are of the temperature-scaled distribution, as GRPOTrainer computes them.
        generation_kwargs: extra ``GenerationConfig`` arguments, as GRPOConfig's ``generation_kwargs`` (they override
            the fields above).
        chat_template_kwargs: extra arguments of ``apply_chat_template`` for conversational prompts, as GRPOConfig's
            (a trainer passes its own tokenization instead, so the ids are exactly the ones it trains on).
        max_prompt_length: keep the last this many prompt tokens (left truncation); None = no truncation (as
            GRPOTrainer 1.16, which does not truncate prompts).
        max_completion_length: maximum new tokens per completion.
        record_prompt_logp: add ``ref_prompt_logp`` (ERPO's l_ref).
        record_completion_logps: add per-token ``ref_completion_logps`` (DPH-RL).
        value_beta: add ``ref_value`` with this beta1 (A*-PO; paper 0.5); None = skip.
        seed: base seed; shard ``i`` samples with seed ``seed * 1_000_003 + i``.
        generation_batch_size: sequences (prompt x sample) per ``generate`` call (not used with continuous
            batching: a shard is one call).
        logprob_batch_size: sequences per scoring forward pass.
        shard_size: prompts per cache shard (the unit of resume and of work sharing between processes).
            These three fix the layout of the computation: a shard is always generated in the same batches, whatever
            the number of processes, so its samples are a function of (seed, shard, layout). They are part of the
            cache key (sampled batches draw their random numbers together: another batch size gives other, equally
            valid samples). Trainers use fixed values, never ones derived from the per-device batch size.
        backend: ``"hf"`` (transformers generate), ``"vllm"`` (needs vllm and a GPU) or ``"auto"`` (vLLM when
            available, else hf). The backend that actually runs is part of the cache key. A trainer with
            ``use_vllm=True`` generates with its own engine instead (docs/presample.md).
        use_vllm: the same as ``backend="vllm"`` (the name TRL's configs use).
        use_transformers_continuous_batching: with ``backend="hf"``, sample with transformers' continuous batching
            (``model.generate_batch``) instead of ``generate``, as GRPOConfig's option of that name: a shard is one
            call, scheduled by the engine (``generation_batch_size`` is not used). Refused with what it would
            silently drop (a repetition penalty, ``generation_kwargs`` other than temperature / top-k / top-p /
            min-p). Same completions format, same distribution; other random draws than ``generate`` (docs).
        transformers_continuous_batching_config: ``transformers.generation.ContinuousBatchingConfig`` arguments
            (JSON dict), as GRPOConfig's (e.g. ``max_batch_tokens``, ``num_blocks``, ``max_memory_percent``); the
            pass owns ``seed``. They fix the engine's batches, so they are part of the cache key (as the name of
            the generator, with the other two options).
        cache_implementation: the KV cache ``generate`` uses (e.g. ``"static"``), as GRPOConfig's; None = the
            model's default. Not used with continuous batching (its cache is paged).
        vllm_tensor_parallel_size, vllm_gpu_memory_utilization, vllm_max_model_length: the offline ``vllm.LLM``'s
            (``trl-variants presample --use_vllm``); resources only, not in the cache key.
        cache_dir: where shards and the final dataset are stored; None = ``$TRL_VARIANTS_CACHE`` or
            ``~/.cache/trl_variants/presample``. ``use_cache=False`` recomputes and stores nothing.
    """

    num_samples: int = field(
        default=8,
        metadata={"help": "Completions per prompt (A*-PO's N, DPH-RL's k); 0 records only prompt "
                          "log-likelihoods (ERPO)."},
    )
    greedy: bool = field(
        default=False, metadata={"help": "Decode greedily instead of sampling (needs num_samples 1)."}
    )
    temperature: float = field(
        default=1.0,
        metadata={"help": "Sampling temperature; log-probs are of the temperature-scaled "
                          "distribution, as GRPOTrainer's."},
    )
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling threshold in (0, 1] (1 = off)."})
    top_k: int = field(default=0, metadata={"help": "Top-k sampling (0 = off)."})
    min_p: float = field(default=0.0, metadata={"help": "Min-p sampling threshold in [0, 1] (0 = off)."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "Repetition penalty (1 = off)."})
    generation_kwargs: dict | None = field(
        default=None,
        metadata={"help": "Extra GenerationConfig arguments, as GRPOConfig's (JSON dict; they "
                          "override the fields above)."},
    )
    chat_template_kwargs: dict | None = field(
        default=None,
        metadata={"help": "Extra apply_chat_template arguments for conversational prompts (JSON "
                          "dict)."},
    )
    max_prompt_length: int | None = field(
        default=None,
        metadata={"help": "Keep the last this many prompt tokens (left truncation); None = no "
                          "truncation."},
    )
    max_completion_length: int = field(default=256, metadata={"help": "Maximum new tokens per completion."})
    record_prompt_logp: bool = field(
        default=True, metadata={"help": "Add the ref_prompt_logp column (ERPO's l_ref)."}
    )
    record_completion_logps: bool = field(
        default=False, metadata={"help": "Add per-token ref_completion_logps (DPH-RL)."}
    )
    value_beta: float | None = field(
        default=None,
        metadata={"help": "Add ref_value = V_hat with this beta1 (A*-PO; paper 0.5); None = "
                          "skip."},
    )
    seed: int = field(
        default=0, metadata={"help": "Base seed; shard i samples with seed seed * 1_000_003 + i."}
    )
    generation_batch_size: int = field(
        default=64,
        metadata={"help": "Sequences (prompt x sample) per generate call (part of the cache "
                          "key)."},
    )
    logprob_batch_size: int = field(
        default=8, metadata={"help": "Sequences per scoring forward pass (part of the cache key)."}
    )
    shard_size: int = field(
        default=64,
        metadata={"help": "Prompts per cache shard: the unit of resume and of work sharing (part "
                          "of the cache key)."},
    )
    backend: str = field(
        default="hf",
        metadata={"help": "'hf' (transformers generate), 'vllm' (needs vllm and a GPU) or 'auto' "
                          "(vLLM when available)."},
    )
    use_vllm: bool = field(
        default=False, metadata={"help": "Generate with vLLM (the same as --backend vllm; needs vllm and a GPU)."}
    )
    use_transformers_continuous_batching: bool = field(
        default=False,
        metadata={"help": "Sample with transformers' continuous batching (model.generate_batch) instead of generate, "
                          "as GRPOConfig's option of that name (backend 'hf' only; one call per shard)."},
    )
    transformers_continuous_batching_config: dict | str | None = field(
        default=None,
        metadata={"help": "transformers ContinuousBatchingConfig arguments (JSON dict, e.g. "
                          "'{\"max_batch_tokens\": 2048}'), as GRPOConfig's (part of the cache key)."},
    )
    cache_implementation: str | None = field(
        default=None,
        metadata={"help": "KV cache of generate (e.g. 'static'), as GRPOConfig's; None = the model's default."},
    )
    vllm_tensor_parallel_size: int = field(
        default=1, metadata={"help": "GPUs the offline vLLM engine spreads the model over (one process only)."}
    )
    vllm_gpu_memory_utilization: float = field(
        default=0.5,
        metadata={"help": "Fraction of each GPU's memory the offline vLLM engine may take; the rest holds the "
                          "transformers model that scores log-probs."},
    )
    vllm_max_model_length: int | None = field(
        default=None,
        metadata={"help": "vLLM's max_model_len (prompt + completion tokens); None = the model's context length."},
    )
    cache_dir: str | None = field(
        default=None,
        metadata={"help": "Where shards and the result are stored; None = $TRL_VARIANTS_CACHE or "
                          "~/.cache/trl_variants/presample."},
    )
    use_cache: bool = field(
        default=True, metadata={"help": "Reuse and store cached shards; off recomputes and stores nothing."}
    )
    show_progress: bool = field(default=True, metadata={"help": "Show a progress bar."})

    # fields that do not change the result (excluded from the cache key; the backend that runs is keyed instead:
    # the transformers engine options are part of its name, ``hf_backend.hf_generator_name``, whether they come from
    # here or from a trainer's options)
    _NOT_IN_KEY = ("backend", "use_vllm", "vllm_tensor_parallel_size", "vllm_gpu_memory_utilization",
                   "vllm_max_model_length", "cache_dir", "use_cache", "show_progress",
                   "use_transformers_continuous_batching", "transformers_continuous_batching_config",
                   "cache_implementation")
    # the transformers engine options, at their defaults (only with backend="hf")
    _HF_ENGINE_DEFAULTS = {"use_transformers_continuous_batching": False,
                           "transformers_continuous_batching_config": None, "cache_implementation": None}

    def __post_init__(self):
        if self.use_cache:
            check_cache_dir(self.cache_dir, "PresampleConfig", "cache_dir")
        if self.num_samples < 0:
            raise ValueError(f"num_samples must be >= 0 (0: prompt log-likelihoods only), got {self.num_samples}")
        if self.value_beta is not None and not self.value_beta > 0:
            raise ValueError(f"value_beta (A*-PO's beta1) must be > 0, got {self.value_beta}")
        if self.value_beta is not None and self.num_samples < 1:
            raise ValueError("value_beta needs num_samples >= 1 (V_hat is computed from sampled rewards)")
        if self.greedy and self.num_samples != 1:
            raise ValueError(f"greedy decoding gives one completion per prompt: num_samples must be 1, got "
                             f"{self.num_samples}")
        if self.record_completion_logps and self.num_samples < 1:
            raise ValueError("record_completion_logps needs num_samples >= 1")
        if not 0 < self.temperature < math.inf:  # a NaN or an infinity fails every comparison but this one
            raise ValueError(f"temperature must be > 0 and finite, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.top_k >= 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 = off), got {self.min_p}")
        if not 0 < self.repetition_penalty < math.inf:
            raise ValueError(f"repetition_penalty must be > 0 and finite (1 = off), got {self.repetition_penalty}")
        for name in ("max_completion_length", "generation_batch_size", "logprob_batch_size", "shard_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.backend not in ("hf", "vllm", "auto"):
            raise ValueError(f"backend must be 'hf', 'vllm' or 'auto', got {self.backend!r}")
        if self.use_vllm:
            self.backend = "vllm"
        from ..generation import engine_config

        self.transformers_continuous_batching_config = engine_config(
            self.transformers_continuous_batching_config, "PresampleConfig.transformers_continuous_batching_config")
        engine_options = [k for k, default in self._HF_ENGINE_DEFAULTS.items() if getattr(self, k) != default]
        if engine_options and self.backend != "hf":
            raise ValueError(f"{', '.join(engine_options)} are options of transformers generation (backend='hf'), but "
                             f"backend={self.backend!r}: vLLM generates with its own engine. Remove them, or use "
                             "backend='hf'")
        if self.use_transformers_continuous_batching and self.num_samples > 0:
            from ..generation import check_continuous_batching

            check_continuous_batching(repetition_penalty=self.repetition_penalty,
                                      generation_kwargs=self.generation_kwargs,
                                      continuous_batching_config=self.transformers_continuous_batching_config)
        if self.vllm_tensor_parallel_size < 1:
            raise ValueError(f"vllm_tensor_parallel_size must be >= 1, got {self.vllm_tensor_parallel_size}")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(f"vllm_gpu_memory_utilization must be in (0, 1], got {self.vllm_gpu_memory_utilization}")

    def key_options(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in self._NOT_IN_KEY}
