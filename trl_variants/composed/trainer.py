"""The composed trainer: GRPO with any subset of ERPO's, DPH-RL's and EEPO's parts, DAPO's dynamic sampling and parts
of your own (docs/parts.md). Each built-in part is the method's own (``erpo/part.py``, ``dph/part.py``,
``eepo/part.py``, ``dapo/part.py``); this class only builds the ones ``ComposedConfig.parts`` lists."""

from __future__ import annotations

from .._citations import GRPO
from ..parts import Part, PartAttribute, PartsTrainer, part_class
from .config import ComposedConfig


class ComposedTrainer(PartsTrainer):
    """GRPOTrainer plus the parts ``ComposedConfig.parts`` lists. Takes exactly GRPOTrainer's arguments."""

    _tag_names = ["trl", "grpo", "trl-variants-composed"]
    _name = "ComposedTrainer"
    _paper = {"citation": GRPO}  # the card adds the paper of each part it runs (Part.citation), and their tags
    _config_class = ComposedConfig
    _config_suffix = "Composed"
    # state its parts hold (checkpointed by them), read through the trainer as on DPHTrainer and EEPOTrainer; an
    # AttributeError when the part is not among this trainer's
    _pef_epoch = PartAttribute("dph_rehearsal", "pef_epoch")
    _pef_pos = PartAttribute("dph_rehearsal", "pef_pos")
    _entropy_history = PartAttribute("eepo_two_stage_rollout", "entropy_history")

    def make_parts(self, args):
        """A Part instance of ``args.parts`` as it is; a name: its registered class's ``from_config(args)``."""
        return [entry if isinstance(entry, Part) else part_class(entry).from_config(args) for entry in args.parts]
