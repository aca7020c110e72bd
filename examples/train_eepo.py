"""Train with EEPO (two-stage sample-then-forget rollouts on top of GRPO).

    accelerate launch examples/train_eepo.py                      # tiny default (configs/eepo/tiny_cpu.yaml), CPU
    accelerate launch --config_file configs/accelerate/zero2.yaml examples/train_eepo.py \\
        --config configs/eepo/qwen2.5-3b.yaml --hub_model_id <you>/<name>   # the paper's setup, on GPUs
    accelerate launch examples/train_eepo.py --max_steps 20 --entropy_gate always   # flags override the YAML

The same as `trl-variants train eepo` (no clone needed): the steps (parse, data, rewards, trainer, train,
save, push) are `trl_variants.training.run_training`.
"""

from trl_variants import EEPOConfig, EEPOTrainer
from trl_variants.training import train_main

if __name__ == "__main__":
    train_main("eepo", EEPOTrainer, EEPOConfig)
