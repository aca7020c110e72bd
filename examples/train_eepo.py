"""Train with EEPO (two-stage sample-then-forget rollouts on top of GRPO).

    accelerate launch examples/train_eepo.py                                        # tiny default, CPU, ~2 min
    accelerate launch examples/train_eepo.py --config configs/eepo/qwen2.5-3b.yaml
    accelerate launch examples/train_eepo.py --max_steps 20 --entropy_gate always   # flags override the YAML
"""

from pathlib import Path

from trl import get_peft_config

from trl_variants import EEPOConfig, EEPOTrainer
from trl_variants.scripts import (
    get_reward_funcs, load_datasets, model_init_kwargs, model_name_or_path, parse_args, train_and_save,
)

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "eepo" / "tiny_cpu.yaml"


def main():
    script_args, training_args, model_args = parse_args(EEPOConfig, default_config=DEFAULT_CONFIG)
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    train_dataset, eval_dataset = load_datasets(script_args, training_args)

    trainer = EEPOTrainer(
        model=model_name_or_path(model_args),
        reward_funcs=get_reward_funcs(script_args.reward_funcs),
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=get_peft_config(model_args),
    )
    train_and_save(trainer, training_args, script_args)


if __name__ == "__main__":
    main()
