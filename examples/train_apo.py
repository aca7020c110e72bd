"""Train with A*-PO (offline optimal values + one-sample advantage regression).

    accelerate launch examples/train_apo.py                                        # tiny default, CPU, ~2 min
    accelerate launch examples/train_apo.py --config configs/apo/qwen2.5-7b.yaml
    accelerate launch examples/train_apo.py --max_steps 20 --value_beta 1.0 # flags override the YAML
"""

from pathlib import Path

from trl import get_peft_config

from trl_variants import APOConfig, APOTrainer
from trl_variants.scripts import (
    get_reward_funcs, load_datasets, model_init_kwargs, model_name_or_path, parse_args, train_and_save,
)

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "apo" / "tiny_cpu.yaml"


def main():
    script_args, training_args, model_args = parse_args(APOConfig, default_config=DEFAULT_CONFIG)
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    train_dataset, eval_dataset = load_datasets(script_args, training_args)

    trainer = APOTrainer(
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
