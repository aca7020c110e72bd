"""Train with EEPO (two-stage sample-then-forget rollouts on top of GRPO).

    accelerate launch examples/train_eepo.py                      # tiny default (configs/eepo/tiny_cpu.yaml), CPU
    accelerate launch examples/train_eepo.py --config configs/eepo/qwen2.5-3b.yaml
    accelerate launch examples/train_eepo.py --max_steps 20 --entropy_gate always   # flags override the YAML

The steps (parse, data, rewards, trainer, train, save, push) are `trl_variants.scripts.run_training`.
"""

from pathlib import Path

from trl_variants import EEPOConfig, EEPOTrainer
from trl_variants.scripts import run_training

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "eepo" / "tiny_cpu.yaml"

if __name__ == "__main__":
    run_training(EEPOTrainer, EEPOConfig, DEFAULT_CONFIG)
