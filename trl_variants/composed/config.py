"""Configuration of :class:`~trl_variants.ComposedTrainer`: ERPO's, DPH-RL's and EEPO's options in one config, and
the list of parts to run."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..dph.config import DPHConfig
from ..eepo.config import EEPOConfig
from ..erpo.config import ERPOConfig

PART_NAMES = ("erpo_query_weights", "erpo_query_kl", "dph_rehearsal", "eepo_two_stage_rollout", "dapo_dynamic_sampling")


@dataclass
class ComposedConfig(ERPOConfig, DPHConfig, EEPOConfig):
    r"""
    Configuration for [`ComposedTrainer`]: GRPO plus any subset of the parts of ERPO, DPH-RL and EEPO (docs/parts.md).

    Every field of [`ERPOConfig`], [`DPHConfig`] and [`EEPOConfig`] applies, with its defaults; ``parts`` decides which
    additions run (ERPO's ``use_query_weights`` is ignored here: ``parts`` says it). A*-PO's regression replaces GRPO's
    loss and group sampling, so it is not a part (use [`APOTrainer`]).

    Parameters:
        parts (`list[str]`, defaults to `["erpo_query_weights", "erpo_query_kl", "dph_rehearsal"]`):
            the additions to run, in any order (training does not depend on it): ``erpo_query_weights`` (advantages times w(s), eq. 8),
            ``erpo_query_kl`` (``query_kl_coef`` times the Query-KL, eq. 10-11), ``dph_rehearsal`` (the D_pef
            f-divergence term after DPH-RL's offline split, eq. 5-7), ``eepo_two_stage_rollout`` (sample-then-forget
            rollouts, Algorithm 1), ``dapo_dynamic_sampling`` (DAPO's dynamic sampling, ``dynamic_sampling_*`` fields;
            ``dynamic_sampling=True`` adds it). An empty list is GRPO; ``["dapo_dynamic_sampling"]`` is GRPO with
            dynamic sampling.
    """

    parts: list[str] = field(
        default_factory=lambda: ["erpo_query_weights", "erpo_query_kl", "dph_rehearsal"],
        metadata={"help": f"Parts to run, any of {list(PART_NAMES)}."},
    )

    def __post_init__(self):
        super().__post_init__()
        self.parts = list(self.parts)
        if self.dynamic_sampling and "dapo_dynamic_sampling" not in self.parts:  # one truth: the parts list
            self.parts.append("dapo_dynamic_sampling")
        self.dynamic_sampling = "dapo_dynamic_sampling" in self.parts
        unknown = [p for p in self.parts if p not in PART_NAMES]
        if unknown:
            raise ValueError(f"ComposedConfig.parts: unknown part(s) {unknown}; choose from {list(PART_NAMES)}")
        if len(set(self.parts)) != len(self.parts):
            raise ValueError(f"ComposedConfig.parts lists a part twice: {self.parts}")
        if "erpo_query_kl" in self.parts and not self.query_kl_coef > 0:
            raise ValueError("ComposedConfig.parts has 'erpo_query_kl' but query_kl_coef is 0: set query_kl_coef > 0 "
                             "(the paper's alpha is 0.01) or drop the part")
        if "eepo_two_stage_rollout" in self.parts and self.entropy_gate == "never":
            raise ValueError("ComposedConfig.parts has 'eepo_two_stage_rollout' but entropy_gate='never' turns it off: "
                             "drop the part or set entropy_gate to 'auto' / 'always'")
