"""Train with TRL's own GRPOTrainer: the baseline every method here is compared against, on the same setup.

    accelerate launch examples/train_grpo.py                      # tiny default (configs/grpo/tiny_cpu.yaml), CPU
    accelerate launch examples/train_grpo.py --seed 1             # flags override the YAML

The steps (parse, data, rewards, trainer, train, save, push) are `trl_variants.scripts.run_training`, as for the
four methods; only the trainer class is TRL's.
"""

from pathlib import Path

from trl import GRPOConfig, GRPOTrainer

from trl_variants.scripts import run_training

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "grpo" / "tiny_cpu.yaml"

if __name__ == "__main__":
    run_training(GRPOTrainer, GRPOConfig, DEFAULT_CONFIG)
