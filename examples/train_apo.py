"""Train with A*-PO (offline optimal values + one-sample advantage regression).

    accelerate launch examples/train_apo.py                      # tiny default (configs/apo/tiny_cpu.yaml), CPU
    accelerate launch examples/train_apo.py --config configs/apo/qwen2.5-7B.yaml
    accelerate launch examples/train_apo.py --max_steps 20 --value_beta 1.0   # flags override the YAML

The steps (parse, data, rewards, trainer, train, save, push) are `trl_variants.scripts.run_training`.
"""

from pathlib import Path

from trl_variants import APOConfig, APOTrainer
from trl_variants.scripts import run_training

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "apo" / "tiny_cpu.yaml"

if __name__ == "__main__":
    run_training(APOTrainer, APOConfig, DEFAULT_CONFIG)
