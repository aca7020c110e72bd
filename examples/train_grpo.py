"""Train with TRL's own GRPOTrainer: the baseline every method here is compared against, on the same setup.

    accelerate launch examples/train_grpo.py                      # tiny default (configs/grpo/tiny_cpu.yaml), CPU
    accelerate launch examples/train_grpo.py --seed 1             # flags override the YAML

The same as `trl-variants train grpo` (no clone needed): the steps (parse, data, rewards, trainer, train,
save, push) are `trl_variants.training.run_training`, as for the four methods; only the trainer class
is TRL's.
"""

from trl import GRPOConfig, GRPOTrainer

from trl_variants.training import train_main

if __name__ == "__main__":
    train_main("grpo", GRPOTrainer, GRPOConfig)
