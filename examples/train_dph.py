"""Train with DPH-RL (f-divergence rehearsal on near-perfect prompts + GRPO on the rest).

    accelerate launch examples/train_dph.py                      # tiny default (configs/dph/tiny_cpu.yaml), CPU
    accelerate launch examples/train_dph.py --config configs/dph/qwen2.5-math-7b.yaml
    accelerate launch examples/train_dph.py --max_steps 20 --divergence forward_kl --dph_coef 0.01   # flags override the YAML

The steps (parse, data, rewards, trainer, train, save, push) are `trl_variants.scripts.run_training`.
"""

from pathlib import Path

from trl_variants import DPHConfig, DPHTrainer
from trl_variants.scripts import run_training

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "dph" / "tiny_cpu.yaml"

if __name__ == "__main__":
    run_training(DPHTrainer, DPHConfig, DEFAULT_CONFIG)
