"""Train with DPH-RL (f-divergence rehearsal on near-perfect prompts + GRPO on the rest).

    accelerate launch examples/train_dph.py                      # tiny default (configs/dph/tiny_cpu.yaml), CPU
    accelerate launch --config_file configs/accelerate/zero2.yaml examples/train_dph.py \\
        --config configs/dph/qwen2.5-math-7b.yaml --hub_model_id <you>/<name>   # the paper's setup, on GPUs
    accelerate launch examples/train_dph.py --max_steps 20 --divergence forward_kl --dph_coef 0.01   # flags override the YAML

The same as `trl-variants train dph` (no clone needed): the steps (parse, data, rewards, trainer, train,
save, push) are `trl_variants.training.run_training`.
"""

from trl_variants import DPHConfig, DPHTrainer
from trl_variants.training import train_main

if __name__ == "__main__":
    train_main("dph", DPHTrainer, DPHConfig)
