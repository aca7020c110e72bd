"""Train with A*-PO (offline optimal values + one-sample advantage regression).

    accelerate launch examples/train_apo.py                      # tiny default (configs/apo/tiny_cpu.yaml), CPU
    accelerate launch --config_file configs/accelerate/zero2.yaml examples/train_apo.py \\
        --config configs/apo/qwen2.5-7B.yaml --hub_model_id <you>/<name>   # the paper's setup, on GPUs
    accelerate launch examples/train_apo.py --max_steps 20 --value_beta 1.0   # flags override the YAML

The same as `trl-variants train apo` (no clone needed): the steps (parse, data, rewards, trainer, train,
save, push) are `trl_variants.training.run_training`.
"""

from trl_variants import APOConfig, APOTrainer
from trl_variants.training import train_main

if __name__ == "__main__":
    train_main("apo", APOTrainer, APOConfig)
