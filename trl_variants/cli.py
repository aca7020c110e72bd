"""``trl-variants`` command line: ``trl-variants {presample,evaluate} --config file.yaml [--flag value ...]``.

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
        from pathlib import Path

        from .presample import dataset_card

        model_id = script_args.model_name_or_path or "trl_variants tiny default"
        result.save_to_disk(script_args.output_dir)
        card = dataset_card(result, model_id, script_args.hub_dataset_id)
        (Path(script_args.output_dir) / "README.md").write_text(card)
        print(f"presampled dataset saved to {script_args.output_dir} ({len(result)} rows)")
        if script_args.push_to_hub:
            from huggingface_hub import DatasetCard

            result.push_to_hub(script_args.hub_dataset_id, private=script_args.hub_private)
            DatasetCard(card).push_to_hub(script_args.hub_dataset_id)
            print(f"pushed to https://huggingface.co/datasets/{script_args.hub_dataset_id}")


@dataclass
class EvaluateScriptArguments(TrainScriptArguments):
    """What to evaluate, on what, and where the report goes."""

    models: list[str] = field(default_factory=list, metadata={"help": "Model paths / Hub ids (default: tiny)."})
    model_names: list[str] | None = field(default=None, metadata={"help": "Display names, one per model."})
    base_model: str | None = field(default=None, metadata={"help": "Base model for keep / exploration rates."})
    reference_model: str | None = field(default=None, metadata={"help": "Reference for KL on the samples."})
    max_prompts: int | None = field(default=None, metadata={"help": "Evaluate the first N prompts only."})
    output_dir: str = field(default="eval", metadata={"help": "Where results.json/.md and the plots go."})


def evaluate_main(argv: list[str]) -> None:
    from accelerate import PartialState

    from .default import DEFAULT_MODEL_PATH
    from .evaluate import EvalConfig, evaluate, write_report

    parser = TrlParser((EvaluateScriptArguments, EvalConfig), prog="trl-variants evaluate")
    script_args, config = parser.parse_args_and_config(args=argv)
    models = script_args.models or [DEFAULT_MODEL_PATH]
    names = script_args.model_names or [None] * len(models)
    if len(names) != len(models):
        raise ValueError(f"--model_names has {len(names)} entries for {len(models)} --models")
    if script_args.torch_threads:
        import torch

        torch.set_num_threads(script_args.torch_threads)
    dataset = load_eval_dataset(script_args)
    state = PartialState()
    accelerator = state if state.num_processes > 1 else None
    rewards = get_reward_funcs(script_args.reward_funcs)
    base = None
    if script_args.base_model:
        base = evaluate(script_args.base_model, None, dataset, rewards, config, name="base", accelerator=accelerator,
                        reference_model=script_args.reference_model)
    results = [] if base is None else [base]
    for model, name in zip(models, names, strict=True):
        results.append(evaluate(model, None, dataset, rewards, config, name=name, base_results=base,
                                reference_model=script_args.reference_model, accelerator=accelerator))
    if state.is_main_process:
        paths = write_report(results, script_args.output_dir)
        print(open(paths["markdown"]).read())
        print("wrote " + ", ".join(paths.values()))


def load_eval_dataset(script_args):
    """The evaluation split: the embedded task's fixed test split, or ``dataset_test_split`` of the dataset."""
    from types import SimpleNamespace

    _, test = load_datasets(script_args, SimpleNamespace(eval_strategy="steps"))
    if test is None:
        raise ValueError(f"dataset {script_args.dataset_name!r} has no split {script_args.dataset_test_split!r}: set "
                         "--dataset_test_split")
    if script_args.max_prompts:
        test = test.select(range(min(script_args.max_prompts, len(test))))
    return test


COMMANDS = {"presample": presample_main, "evaluate": evaluate_main}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(f"usage: trl-variants {{{','.join(COMMANDS)}}} --config FILE.yaml [--option value ...]")
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    main()
