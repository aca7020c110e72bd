"""Configuration of :class:`~trl_variants.APOTrainer`."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields

from trl import GRPOConfig

from .._config_checks import check_common, check_number, launch_processes
from .._numerics import GuardedConfig
from .._validation import check_cache_dir

_NO_RATIO = "the regression has no importance ratio: samples (vLLM's included) enter it as they are"
_NO_SURROGATE = "A*-PO's loss is its least-squares regression, not one of GRPO's surrogate losses"
_NO_GROUP = "the regression target is r - V_hat(x), not a group-normalised advantage"
# GRPOConfig options that A*-PO's loss does not use. Left at GRPOConfig's defaults they change nothing; a changed value
# would be silently ignored, so it is refused (field, reason). Checked against TRL 1.16's GRPOConfig.
UNUSED_GRPO_OPTIONS: dict[str, str] = {
    "loss_type": _NO_SURROGATE,
    "epsilon": "the regression has no ratio clipping",
    "epsilon_high": "the regression has no ratio clipping",
    "delta": "the regression has no ratio clipping",
    "importance_sampling_level": _NO_RATIO,
    "sapo_temperature_neg": _NO_SURROGATE, "sapo_temperature_pos": _NO_SURROGATE,
    "vespo_k_pos": _NO_SURROGATE, "vespo_lambda_pos": _NO_SURROGATE,
    "vespo_k_neg": _NO_SURROGATE, "vespo_lambda_neg": _NO_SURROGATE,
    "scale_rewards": _NO_GROUP,
    "multi_objective_aggregation": _NO_GROUP + " (rewards are summed with reward_weights)",
    "top_entropy_quantile": "the regression has no entropy mask",
    "use_adaptive_entropy": "the optional entropy bonus uses the fixed entropy_coef",
    "off_policy_mask_threshold": "the regression has no off-policy sequence mask",
    "use_bias_correction_kl": "there is no separate KL term (beta is beta2 inside the regression)",
    "vllm_importance_sampling_mode": _NO_RATIO,
    "vllm_importance_sampling_clip_max": _NO_RATIO,
    "vllm_importance_sampling_clip_min": _NO_RATIO,
    "vllm_importance_sampling_cap": _NO_RATIO,
    "mask_truncated_completions": "every sample's reward is a regression target, truncated ones included",
    "sync_ref_model": "V_hat(x) comes from the frozen reference; moving the reference would change the target",
}


def check_unused_grpo_options(config) -> None:
    """Refuse a non-default value of a GRPO option A*-PO's loss ignores (see ``UNUSED_GRPO_OPTIONS``)."""
    defaults = {f.name: f.default for f in fields(GRPOConfig) if f.default is not MISSING}
    for name, reason in UNUSED_GRPO_OPTIONS.items():
        if name in defaults and getattr(config, name) != defaults[name]:
            raise ValueError(f"APOConfig.{name}={getattr(config, name)!r} has no effect in A*-PO: {reason}. Remove it "
                             f"(leave the default {defaults[name]!r}) or train with GRPOTrainer.")


@dataclass
class APOConfig(GuardedConfig):
    r"""
    Configuration for [`APOTrainer`]: A*-PO ("Accelerating RL for LLM Reasoning with Optimal Advantage Regression",
    arXiv 2505.20686, Sec. 3, App. A.5; equations and defaults in docs/algorithms.md).

    Stage 1 (offline, cached): ``num_value_samples`` (N = 8) reference samples per prompt and
    ``V_hat(x) = beta1 log mean exp(r / beta1)`` with ``value_beta`` (beta1 = 0.5). Stage 2: ONE completion per prompt
    (``num_generations = 1``, the default here) and the regression loss
    ``mean (beta2 log(pi/pi_ref)(y|x) - (r - V_hat(x)))^2``; ``beta2`` is GRPOConfig's ``beta`` (default here 1e-3).
    No clipping, no group or length normalisation. ``entropy_coef`` (GRPO's field) adds the optional entropy bonus of
    the authors' config (off by default). GRPO's surrogate-loss options (``loss_type``, ``epsilon``, ``delta``,
    ``scale_rewards``, ``top_entropy_quantile``, the importance-sampling options, ...; the full list with reasons is
    ``UNUSED_GRPO_OPTIONS``) have no effect on this loss: changing one from its default is refused.

    Parameters:
        num_value_samples (`int`, defaults to `8`): N, reference samples per prompt in stage 1.
        value_beta (`float`, defaults to `0.5`): beta1 of the value estimate.
        filter_all_incorrect (`bool`, defaults to `False`): drop prompts whose N samples are all wrong (Sec. 4.4).
        correctness_threshold (`float`, defaults to `1.0`): a reference sample is correct when its reward is at least
            this (for ``filter_all_incorrect`` and the pass's ``frac_all_correct`` / ``frac_all_wrong``); 1.0 is a
            right answer under the paper's binary reward. With a dense or shaped reward, set the value that means
            "solved".
        check_binary_rewards (`bool`, defaults to `True`): warn once when a reward is not 0 or 1.
        presample_cache_dir (`str`, *optional*): cache of the offline pass (default
            ``~/.cache/trl_variants/presample``).
        presample_generation_batch_size (`int`, defaults to `64`): sequences per ``generate`` call in stage 1. Part
            of the pass's fixed layout (and cache key): never derived from the per-device batch, so the reference
            samples are the same with 1 or N processes.
        presample_shard_size (`int`, defaults to `64`): prompts per shard of stage 1 (its unit of caching, resume and
            work sharing, and of the lazy pass below). Part of the fixed layout and cache key: a shard's prompts are
            sampled together from one seed, so another size gives other (equally valid) reference samples.
        lazy_value_pass (`bool` or `None`, defaults to `None`): the lazy stage 1. ``None``: lazy when it is safe (none
            of the refusals below applies, a frozen reference model exists, no PEFT) and saves at least half the
            work (the run reaches at most half the stage-1 shards, divided by the number of processes), else the
            full pass; ``True``: lazy (refused where unsafe); ``False``: the full pass, in ``__init__``. On the
            command line: ``--lazy_value_pass true`` / ``false``. Lazily, nothing is sampled in ``__init__``; during
            training, before a generation batch uses a prompt whose value is not known, every process computes
            together the stage-1 shards holding that prompt and the next ``lazy_value_chunk_size`` prompts in the
            order the (seeded) train sampler will ask for them. A short run pays only for the shards it reaches.
            Each shard is the full pass's own computation (same seed, batches and cache entry), so the values are
            exactly the full pass's, 1 or N processes, and a restarted run or a later full pass reuses the cached
            shards. With a shuffled dataset a run reaches prompts all over it: a small ``presample_shard_size``
            (1 for exactly the prompts reached) makes the pass follow the run closely. ``True`` is refused
            where it is not safe: with ``filter_all_incorrect`` (dropping prompts needs every value before the
            sampler is built), with ``use_vllm`` (after the first update the engine holds the policy, not the
            reference), with a streaming dataset (no sampler order) and with ZeRO-3 / FSDP (no unsharded
            reference to sample mid-training). A prompt without a value estimate (no reference sample got a
            reward) gets weight 0 in the loss, with a warning and the metric ``apo/unvalued_fraction`` (the full pass
            leaves such prompts out of the dataset before training); when no prompt valued so far has one, training
            stops, as the full pass does. Only
            A*-PO has this option: DPH-RL's split and ERPO's dataset-mean query weights need every prompt before
            training.
        lazy_value_chunk_size (`int`, defaults to `64`): prompts (in sampler order) the lazy pass values ahead of
            need each time it runs.
    """

    num_generations: int | None = field(default=1, metadata={"help": "Completions per prompt in stage 2 (A*-PO: 1)."})
    beta: float = field(default=1e-3, metadata={"help": "beta2: weight of the log-ratio in the regression."})
    num_value_samples: int = field(default=8, metadata={"help": "N: reference samples per prompt (stage 1)."})
    value_beta: float = field(default=0.5, metadata={"help": "beta1 of V_hat = beta1 log mean exp(r / beta1)."})
    filter_all_incorrect: bool = field(default=False, metadata={"help": "Drop prompts with N wrong samples."})
    correctness_threshold: float = field(
        default=1.0, metadata={"help": "A reference sample is correct when its reward is at least this."})
    check_binary_rewards: bool = field(default=True, metadata={"help": "Warn when rewards are not in {0, 1}."})
    presample_cache_dir: str | None = field(default=None, metadata={"help": "Cache directory of the offline pass."})
    presample_generation_batch_size: int = field(
        default=64, metadata={"help": "Sequences per generate call in stage 1 (fixed layout)."})
    presample_shard_size: int = field(
        default=64, metadata={"help": "Prompts per stage-1 shard (cache, resume and lazy unit; fixed layout)."})
    lazy_value_pass: bool | None = field(
        default=None, metadata={"help": "Lazy stage 1: value only the prompts the run reaches, in sampler order, "
                                        "ahead of need (same values as the full pass). None (default): when it is "
                                        "safe and saves work; True: always (refused where unsafe); False: never."})
    lazy_value_chunk_size: int = field(
        default=64, metadata={"help": "Prompts the lazy stage 1 values ahead of need each time it runs."})

    # own fields a resume may change (_checkpoint.resume_fields): where the offline pass is cached (its key holds
    # what matters), a warning, when stage 1 runs (not its values: the same shards)
    resume_free_fields = frozenset({"presample_cache_dir", "check_binary_rewards", "lazy_value_pass",
                                    "lazy_value_chunk_size"})

    def _stand_in_group_size(self) -> int:
        """The group size GRPOConfig's checks see for A*-PO's one completion per prompt: one that divides every
        generation batch, so that no error names a group size nobody set (a stand-in of 2 failed an odd batch with
        "divisible by num_generations (2)"): the batch itself where it is given, else one process's rows
        (``per_device_train_batch_size x steps_per_generation``; GRPOConfig multiplies them by the processes)."""
        steps = self.steps_per_generation or self.gradient_accumulation_steps
        if self.generation_batch_size is not None:  # GRPOConfig names a batch its processes cannot split itself
            rows, processes = self.generation_batch_size, None
        else:
            processes = launch_processes()
            # one process's rows divide every batch GRPOConfig makes of them; all processes' only where that is 1 row
            rows = self.per_device_train_batch_size * steps
            rows = rows if rows >= 2 else rows * processes
        if rows < 2:
            raise ValueError(
                "APOConfig: A*-PO's generation batch is 1 row ("
                + (f"generation_batch_size {rows}" if processes is None else
                   f"per_device_train_batch_size {self.per_device_train_batch_size} x {processes} process x "
                   f"steps_per_generation {steps}")
                + "), and GRPOConfig, which APOConfig extends, needs at least 2: raise per_device_train_batch_size, "
                "gradient_accumulation_steps or steps_per_generation (or generation_batch_size where you set it)")
        return rows

    def __post_init__(self):
        check_common(self)  # options TRL accepts but that fail after the model load
        check_unused_grpo_options(self)
        check_cache_dir(self.presample_cache_dir, "APOConfig", "presample_cache_dir")
        if self.num_generations is None or self.num_generations < 1:
            raise ValueError(f"num_generations must be >= 1 (A*-PO samples one completion per prompt), got "
                             f"{self.num_generations}")
        if self.num_value_samples < 1:
            raise ValueError(f"num_value_samples (N) must be >= 1, got {self.num_value_samples}")
        if not self.value_beta > 0:  # inf is the limit V_hat = mean reward (losses.optimal_value)
            raise ValueError(f"value_beta (beta1) must be > 0, got {self.value_beta}")
        check_number(self, "correctness_threshold", fix="a reference sample is correct when its reward is at least "
                     "this; 1.0 for accuracy_reward")
        if self.presample_generation_batch_size < 1:
            raise ValueError(f"presample_generation_batch_size must be >= 1, got {self.presample_generation_batch_size}")
        if self.presample_shard_size < 1:
            raise ValueError(f"presample_shard_size must be >= 1, got {self.presample_shard_size}")
        if self.lazy_value_chunk_size < 1:
            raise ValueError(f"lazy_value_chunk_size must be >= 1, got {self.lazy_value_chunk_size}")
        if self.lazy_value_pass and self.filter_all_incorrect:
            raise ValueError("lazy_value_pass with filter_all_incorrect: dropping the all-wrong prompts changes the "
                             "dataset the sampler orders, so it needs every value before training. Use one of them")
        if self.lazy_value_pass and self.use_vllm:
            raise ValueError("lazy_value_pass with use_vllm: after the first update the vLLM engine holds the policy, "
                             "not the reference, so later stage-1 chunks could not sample as the full pass does. Set "
                             "lazy_value_pass=False (the full pass samples with the engine before training)")
        if not self.beta > 0:
            raise ValueError(f"beta (A*-PO's beta2) must be > 0, got {self.beta}")
        single = self.num_generations == 1
        if single:  # GRPOConfig refuses G < 2 (it needs groups for advantages); A*-PO has none
            self.num_generations = self._stand_in_group_size()
            if self.num_generations_eval is None:
                self.num_generations_eval = 1
        try:
            super().__post_init__()
        finally:
            if single:
                self.num_generations = 1
