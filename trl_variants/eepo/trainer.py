"""EEPO: two-stage sample-then-forget rollouts (EEPO paper, arXiv 2510.05837, Sec. 3, Algorithm 1; docs/algorithms.md).

The algorithm box is ``eepo/part.py``: one part (``TwoStageRollout``, which owns the rollout) on the parts trainer
(``trl_variants/parts.py``).
"""

from __future__ import annotations

from .._citations import EEPO, paper
from ..dapo.part import with_dynamic_sampling
from ..parts import PartAttribute, PartsTrainer
from .config import EEPOConfig
from .part import TwoStageRollout


class EEPOTrainer(PartsTrainer):
    """Exploration-Enhanced Policy Optimization. Takes GRPOTrainer's arguments; see [`EEPOConfig`]."""

    _tag_names = ["trl", "grpo", "eepo"]
    _name = "EEPO"
    _paper = paper("EEPO: Exploration-Enhanced Policy Optimization via Sample-Then-Forget", "2510.05837", EEPO)
    _config_class = EEPOConfig
    _config_suffix = "EEPO"
    # the entropy gate's moving window, held (and checkpointed) by the rollout part
    _entropy_history = PartAttribute("eepo_two_stage_rollout", "entropy_history")
    _pending_old_logps = PartAttribute("eepo_two_stage_rollout", "pending_old_logps")
    _pending_stage2 = PartAttribute("eepo_two_stage_rollout", "pending_stage2")

    def make_parts(self, args):
        return with_dynamic_sampling([TwoStageRollout()], args)
