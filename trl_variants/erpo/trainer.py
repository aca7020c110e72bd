"""ERPO: GRPO with query-weighted advantages and Query-KL (ERPO preprint Sec. 4, App. G; docs/algorithms.md).

The algorithm box is ``erpo/part.py``: two parts (``QueryWeights``, ``QueryKL``) on the parts trainer
(``trl_variants/parts.py``); this class picks them from an :class:`ERPOConfig`.
"""

from __future__ import annotations

from .._citations import ERPO, paper
from ..dapo.part import with_dynamic_sampling
from ..parts import PartsTrainer
from .config import ERPOConfig
from .part import erpo_parts


class ERPOTrainer(PartsTrainer):
    """Environment-Regularized Policy Optimization. Takes exactly GRPOTrainer's arguments; see [`ERPOConfig`]."""

    _tag_names = ["trl", "grpo", "erpo"]
    _name = "ERPO"
    _paper = paper(  # anonymous preprint under double-blind review: no arXiv id (the card names it, see _card.py)
        "Beyond the Stability-Exploration Dilemma: Environmental Regularization for LLM Policy Optimization",
        None, ERPO,
    )
    _config_class = ERPOConfig
    _config_suffix = "ERPO"

    def make_parts(self, args):
        return with_dynamic_sampling(erpo_parts(args), args)
