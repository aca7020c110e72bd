"""DPH-RL: GRPO on exploration prompts + f-divergence rehearsal on near-perfect prompts (DPH-RL paper,
arXiv 2509.07430, Sec. 4, eq. 5-7, App. C, G; equations and defaults in docs/algorithms.md).

The algorithm box is ``dph/part.py``: one part (``Rehearsal``: the offline split, the D_pef stream and the loss) on
the parts trainer (``trl_variants/parts.py``).
"""

from __future__ import annotations

from .._citations import DPH, paper
from ..dapo.part import with_dynamic_sampling
from ..parts import PartAttribute, PartsTrainer
from .config import DPHConfig
from .part import Rehearsal


class DPHTrainer(PartsTrainer):
    """Diversity-Preserving Hybrid RL. Takes GRPOTrainer's arguments; see [`DPHConfig`]."""

    _tag_names = ["trl", "grpo", "dph-rl"]
    _name = "DPH-RL"
    _paper = paper("The Choice of Divergence: A Neglected Key to Mitigating Diversity Collapse in Reinforcement "
                   "Learning with Verifiable Reward", "2509.07430", DPH)
    _config_class = DPHConfig
    _config_suffix = "DPH"
    # the D_pef stream position, held (and checkpointed) by the rehearsal part
    _pef_epoch = PartAttribute("dph_rehearsal", "pef_epoch")
    _pef_pos = PartAttribute("dph_rehearsal", "pef_pos")

    def make_parts(self, args):
        return with_dynamic_sampling([Rehearsal(args)], args)
