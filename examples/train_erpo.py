"""Train with ERPO (Query-KL + query-weighted advantages on top of GRPO).

    accelerate launch examples/train_erpo.py                      # tiny default (configs/erpo/tiny_cpu.yaml), CPU
    accelerate launch --config_file configs/accelerate/zero2.yaml examples/train_erpo.py \\
        --config configs/erpo/qwen2.5-math-7b.yaml --hub_model_id <you>/<name>   # the paper's setup, on GPUs
    accelerate launch examples/train_erpo.py --max_steps 20 --query_kl_coef 0.05   # flags override the YAML

The same as `trl-variants train erpo` (no clone needed): the steps (parse, data, rewards, trainer, train,
save, push) are `trl_variants.training.run_training`.
"""

from trl_variants import ERPOConfig, ERPOTrainer
from trl_variants.training import train_main

if __name__ == "__main__":
    train_main("erpo", ERPOTrainer, ERPOConfig)
