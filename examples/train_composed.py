"""Train GRPO with any combination of parts: ERPO's query weights and Query-KL, DPH-RL's rehearsal, EEPO's
two-stage rollout and DAPO's dynamic sampling (docs/parts.md).

    accelerate launch examples/train_composed.py                  # tiny default (configs/composed/tiny_cpu.yaml), CPU
    accelerate launch examples/train_composed.py --parts dph_rehearsal dapo_dynamic_sampling --max_steps 20

The same as `trl-variants train composed` (no clone needed): the steps are
`trl_variants.training.run_training`.
"""

from trl_variants import ComposedConfig, ComposedTrainer
from trl_variants.training import train_main

if __name__ == "__main__":
    train_main("composed", ComposedTrainer, ComposedConfig)
