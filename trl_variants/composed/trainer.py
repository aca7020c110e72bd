"""The composed trainer: GRPO with any subset of ERPO's, DPH-RL's and EEPO's parts (docs/parts.md). Each part is the
method's own (``erpo/part.py``, ``dph/part.py``, ``eepo/part.py``); this class only picks them from the config."""

from __future__ import annotations

from .._citations import DPH, EEPO, ERPO, GRPO
from ..dapo.part import DynamicSampling
from ..dph.part import Rehearsal
from ..eepo.part import TwoStageRollout
from ..erpo.part import QueryKL, QueryWeights
from ..parts import PartsTrainer
from .config import ComposedConfig


class ComposedTrainer(PartsTrainer):
    """GRPOTrainer plus the parts ``ComposedConfig.parts`` names. Takes exactly GRPOTrainer's arguments."""

    _tag_names = ["trl", "grpo", "trl-variants-composed"]
    _name = "ComposedTrainer"
    _paper = {"citation": "\n\n".join([ERPO, DPH, EEPO, GRPO])}  # every paper whose part it can run, and GRPO
    _config_class = ComposedConfig
    _config_suffix = "Composed"

    def make_parts(self, args):
        build = {"erpo_query_weights": lambda: QueryWeights(args.query_weight_source),
                 "erpo_query_kl": lambda: QueryKL(args.query_kl_coef, args.query_kl_estimator),
                 "dph_rehearsal": lambda: Rehearsal(args),
                 "eepo_two_stage_rollout": TwoStageRollout,
                 "dapo_dynamic_sampling": lambda: DynamicSampling.from_config(args)}
        return [build[name]() for name in args.parts]
