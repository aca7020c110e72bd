"""Configuration of :class:`~trl_variants.APOTrainer`."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from .._validation import check_common


@dataclass
class APOConfig(GRPOConfig):
    r"""
    Configuration for [`APOTrainer`]: A*-PO (ALGORITHMS.md, A*-PO; "Accelerating RL for LLM Reasoning with Optimal
    Advantage Regression", arXiv 2505.20686).

    Stage 1 (offline, cached): ``num_value_samples`` (N = 8) reference samples per prompt and
    ``V_hat(x) = beta1 log mean exp(r / beta1)`` with ``value_beta`` (beta1 = 0.5). Stage 2: ONE completion per prompt
    (``num_generations = 1``, the default here) and the regression loss
    ``mean (beta2 log(pi/pi_ref)(y|x) - (r - V_hat(x)))^2``; ``beta2`` is GRPOConfig's ``beta`` (default here 1e-3).
    No clipping, no group or length normalisation. ``entropy_coef`` (GRPO's field) adds the optional entropy bonus of
    the authors' config (off by default).

    Parameters:
        num_value_samples (`int`, defaults to `8`): N, reference samples per prompt in stage 1.
        value_beta (`float`, defaults to `0.5`): beta1 of the value estimate.
        filter_all_incorrect (`bool`, defaults to `False`): drop prompts whose N samples are all wrong (Sec. 4.4).
        check_binary_rewards (`bool`, defaults to `True`): warn once when a reward is not 0 or 1.
        presample_cache_dir (`str`, *optional*): cache of the offline pass (default ``~/.cache/trl_variants``).
        presample_generation_batch_size (`int`, defaults to `64`): sequences per ``generate`` call in stage 1. Part
            of the pass's fixed layout (and cache key): never derived from the per-device batch, so the reference
            samples are the same with 1 or N processes.
    """

    num_generations: int | None = field(default=1, metadata={"help": "Completions per prompt in stage 2 (A*-PO: 1)."})
    beta: float = field(default=1e-3, metadata={"help": "beta2: weight of the log-ratio in the regression."})
    num_value_samples: int = field(default=8, metadata={"help": "N: reference samples per prompt (stage 1)."})
    value_beta: float = field(default=0.5, metadata={"help": "beta1 of V_hat = beta1 log mean exp(r / beta1)."})
    filter_all_incorrect: bool = field(default=False, metadata={"help": "Drop prompts with N wrong samples."})
    check_binary_rewards: bool = field(default=True, metadata={"help": "Warn when rewards are not in {0, 1}."})
    presample_cache_dir: str | None = field(default=None, metadata={"help": "Cache directory of the offline pass."})
    presample_generation_batch_size: int = field(
        default=64, metadata={"help": "Sequences per generate call in stage 1 (fixed layout)."})

    def __post_init__(self):
        check_common(self)  # options TRL accepts but that fail after the model load (issue #16)
        if self.num_generations is None or self.num_generations < 1:
            raise ValueError(f"num_generations must be >= 1 (A*-PO samples one completion per prompt), got "
                             f"{self.num_generations}")
        if self.num_value_samples < 1:
            raise ValueError(f"num_value_samples (N) must be >= 1, got {self.num_value_samples}")
        if not self.value_beta > 0:
            raise ValueError(f"value_beta (beta1) must be > 0, got {self.value_beta}")
        if self.presample_generation_batch_size < 1:
            raise ValueError(f"presample_generation_batch_size must be >= 1, got {self.presample_generation_batch_size}")
        if not self.beta > 0:
            raise ValueError(f"beta (A*-PO's beta2) must be > 0, got {self.beta}")
        single = self.num_generations == 1
        if single:  # GRPOConfig refuses G < 2 (it needs groups for advantages); A*-PO has none
            self.num_generations = max(2, self.per_device_train_batch_size)
            if self.num_generations_eval is None:
                self.num_generations_eval = 1
        try:
            super().__post_init__()
        finally:
            if single:
                self.num_generations = 1
