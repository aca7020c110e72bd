"""Configuration of DAPO's dynamic sampling (Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at
Scale", arXiv:2503.14476, Sec. 3.2): the fields every GRPO-family config here inherits (ERPO, DPH-RL, EEPO and the
composed trainer's)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._config_checks import refuse_inert
from .._numerics import GuardedConfig


@dataclass
class DynamicSamplingConfig(GuardedConfig):
    r"""
    [`~trl.GRPOConfig`] (with the numerical guards' field, ``low_precision_weights``) plus DAPO's dynamic sampling (off by default: then the trainer is exactly what it was).

    Parameters:
        dynamic_sampling (`bool`, defaults to `False`):
            Drop every group whose rewards are all equal (all correct or all wrong: zero advantage, no gradient) and
            sample more prompts until the generation batch holds only groups with a learning signal (DAPO eq. 11,
            "0 < |{correct}| < G"). Refill prompts come from a second seeded pass over the training set.
        dynamic_sampling_max_rounds (`int`, defaults to `10`):
            Bound on generation rounds per generation batch (the first one included). When it is reached before the
            batch is full, the batch is completed with dropped groups whose completions are masked out of the loss
            (the step trains on what there is), with a warning and the metric ``dynamic_sampling/unfilled_groups``.
    """

    dynamic_sampling: bool = field(
        default=False,
        metadata={"help": "DAPO dynamic sampling: drop groups whose rewards are all equal and refill the batch."},
    )
    dynamic_sampling_max_rounds: int = field(
        default=10, metadata={"help": "Most generation rounds per generation batch with dynamic sampling."}
    )

    def __post_init__(self):
        super().__post_init__()
        if self.dynamic_sampling_max_rounds < 1:
            raise ValueError(f"dynamic_sampling_max_rounds must be >= 1, got {self.dynamic_sampling_max_rounds}")
        if not self.dynamic_sampling:
            refuse_inert(self, {"dynamic_sampling_max_rounds": "does nothing without dynamic_sampling=True: set "
                                                               "dynamic_sampling=True or drop it"})
