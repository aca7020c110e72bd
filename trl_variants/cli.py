"""``trl-variants`` command line: ``trl-variants presample --config presample.yaml [--flag value ...]``.

Arguments are parsed with TRL's ``TrlParser`` (YAML via ``--config``, command-line flags override it).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from trl import TrlParser

from .presample import PresampleConfig
from .scripts import TrainScriptArguments, get_reward_funcs, load_datasets


@dataclass
class PresampleScriptArguments(TrainScriptArguments):
    """Where the pass reads from and writes to."""

    model_name_or_path: str | None = field(default=None, metadata={"help": "Reference model (default: tiny)."})
    output_dir: str = field(default="presampled", metadata={"help": "save_to_disk directory of the result."})
    split: str = field(default="train", metadata={"help": "Which split to presample: 'train' or 'test'."})
    push_to_hub: bool = field(default=False, metadata={"help": "Publish the result as a Hub dataset."})
    hub_dataset_id: str | None = field(default=None, metadata={"help": "Hub dataset repo id (org/name)."})
    hub_private: bool = field(default=False, metadata={"help": "Create the Hub dataset as private."})


def presample_main(argv: list[str]) -> None:
    from accelerate import PartialState

    from .default import DEFAULT_MODEL_PATH
    from .presample import presample

    parser = TrlParser((PresampleScriptArguments, PresampleConfig), prog="trl-variants presample")
    script_args, config = parser.parse_args_and_config(args=argv)
    if script_args.push_to_hub and not script_args.hub_dataset_id:
        raise ValueError("--push_to_hub needs --hub_dataset_id org/name")
    if script_args.torch_threads:
        import torch

        torch.set_num_threads(script_args.torch_threads)
    script_args.dataset_test_split = "test"
    train, _ = load_datasets(script_args)
    if script_args.split == "test":
        from .scripts import EMBEDDED

        if script_args.dataset_name != EMBEDDED:
            raise ValueError("--split test is only supported for the embedded dataset; pass the test split as "
                             "--dataset_name / --dataset_train_split instead")
        from .default import load_default_dataset

        train = load_default_dataset(script_args.embedded_train_size, script_args.embedded_test_size,
                                     seed=script_args.embedded_seed)["test"]
    state = PartialState()
    result = presample(script_args.model_name_or_path or DEFAULT_MODEL_PATH, None, train,
                       get_reward_funcs(script_args.reward_funcs) if config.num_samples else [], config,
                       accelerator=state if state.num_processes > 1 else None)
    if state.is_main_process:
        result.save_to_disk(script_args.output_dir)
        print(f"presampled dataset saved to {script_args.output_dir} ({len(result)} rows)")
        if script_args.push_to_hub:
            result.push_to_hub(script_args.hub_dataset_id, private=script_args.hub_private)
            print(f"pushed to https://huggingface.co/datasets/{script_args.hub_dataset_id}")


COMMANDS = {"presample": presample_main}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(f"usage: trl-variants {{{','.join(COMMANDS)}}} --config FILE.yaml [--option value ...]")
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    main()
