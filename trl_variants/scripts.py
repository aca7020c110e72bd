"""Plumbing shared by the example scripts (``examples/train_*.py``) and the ``trl-variants`` CLI.

Arguments are parsed the TRL way: ``TrlParser`` over (script arguments, the trainer's config, ``ModelConfig``), a
``--config file.yaml`` supplying values and command-line flags overriding them.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trl import ModelConfig, ScriptArguments, TrlParser

from ._validation import check_model_reference, check_no_none
from .default import DEFAULT_MODEL_PATH, load_default_dataset
from .rewards import REWARD_FUNCS

EMBEDDED = "embedded"
"""``dataset_name`` value (the default) selecting the shipped synthetic math task."""


@dataclass
class TrainScriptArguments(ScriptArguments):
    """Dataset and reward options of the example scripts.

    ``dataset_name``: a Hub id or local path loaded with ``datasets.load_dataset`` (``load_from_disk`` for a saved
    dataset directory, e.g. the output of ``trl-variants presample``), or ``"embedded"`` for the shipped synthetic
    task. The dataset needs a ``prompt`` column and the gold column the reward functions read (``solution``).
    """

    dataset_name: str | None = field(default=EMBEDDED, metadata={"help": "Hub id, local path or 'embedded'."})
    embedded_train_size: int = field(default=2000, metadata={"help": "Training prompts of the embedded task."})
    embedded_test_size: int = field(default=200, metadata={"help": "Held-out prompts of the embedded task."})
    embedded_seed: int = field(default=0, metadata={"help": "Seed of the embedded task's training split."})
    reward_funcs: list[str] = field(
        default_factory=lambda: ["accuracy_reward"],
        metadata={"help": f"Reward functions: {sorted(REWARD_FUNCS)} or a dotted import path ('pkg.mod.func')."},
    )
    prompt_column: str = field(
        default="prompt",
        metadata={"help": "Column with the prompt. Any other column is turned into a conversational 'prompt' "
                          "(one user message: the text plus prompt_suffix)."},
    )
    prompt_suffix: str = field(default="", metadata={"help": "Appended to the prompt text (with prompt_column)."})
    solution_column: str = field(default="solution", metadata={"help": "Gold-answer column (renamed 'solution')."})
    filter_column: str | None = field(default=None, metadata={"help": "Keep only rows whose column value ..."})
    filter_values: list[str] | None = field(default=None, metadata={"help": "... is one of these (as strings)."})
    torch_threads: int | None = field(
        default=None, metadata={"help": "torch.set_num_threads for CPU runs (default: torch's choice)."}
    )


def parse_args(config_cls, default_config: str | Path | None = None, argv: list[str] | None = None):
    """``(script_args, training_args, model_args)`` from the command line; ``default_config`` is used as
    ``--config`` when none is given (so an example runs with no arguments)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if default_config is not None and "--config" not in argv:
        argv = ["--config", str(default_config), *argv]
    parser = TrlParser((TrainScriptArguments, config_cls, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    if script_args.torch_threads:
        import torch

        torch.set_num_threads(script_args.torch_threads)
    return script_args, training_args, model_args


def get_reward_funcs(names: list[str]):
    """Reward callables by registry name (``accuracy_reward``, ``format_reward``) or dotted import path."""
    if not names:
        raise ValueError("reward_funcs is empty: give at least one, e.g. --reward_funcs accuracy_reward")
    funcs = []
    for name in names:
        if name in REWARD_FUNCS:
            funcs.append(REWARD_FUNCS[name])
        elif "." in name:
            module, attr = name.rsplit(".", 1)
            sys.path.insert(0, os.getcwd())
            funcs.append(getattr(importlib.import_module(module), attr))
        else:
            raise ValueError(f"unknown reward function {name!r}: use one of {sorted(REWARD_FUNCS)} or 'pkg.module.func'")
    return funcs


def load_datasets(script_args: TrainScriptArguments, training_args=None):
    """``(train_dataset, eval_dataset or None)`` per the script arguments."""
    name = script_args.dataset_name or EMBEDDED
    if name == EMBEDDED:
        ds = load_default_dataset(
            script_args.embedded_train_size, script_args.embedded_test_size, seed=script_args.embedded_seed
        )
    elif os.path.isdir(name) and any((Path(name) / f).exists() for f in ("dataset_dict.json", "state.json")):
        from datasets import load_from_disk

        ds = load_from_disk(name)
    else:
        from datasets import load_dataset

        ds = load_dataset(name, name=script_args.dataset_config, streaming=script_args.dataset_streaming)
    if not hasattr(ds, "keys"):  # a single Dataset
        train, test = ds, None
    else:
        if script_args.dataset_train_split not in ds:
            raise ValueError(
                f"dataset {name!r} has no split {script_args.dataset_train_split!r} (splits: {list(ds)}); "
                "set --dataset_train_split"
            )
        train = ds[script_args.dataset_train_split]
        test = ds.get(script_args.dataset_test_split)
    train = _prepare_columns(train, script_args, name)
    test = None if test is None else _prepare_columns(test, script_args, name)
    wants_eval = training_args is not None and getattr(training_args, "eval_strategy", "no") != "no"
    return train, (test if wants_eval else None)


def _prepare_columns(ds, script_args: TrainScriptArguments, name: str):
    """Filter rows, build the conversational ``prompt`` and the ``solution`` column the rewards read."""
    cols = ds.column_names
    for needed in {script_args.prompt_column, *([script_args.filter_column] if script_args.filter_column else [])}:
        if needed not in cols:
            raise ValueError(f"dataset {name!r} has no column {needed!r} (columns: {cols}); set --prompt_column / "
                             "--filter_column to one of them")
    if script_args.filter_column:
        keep = set(script_args.filter_values or [])
        ds = ds.filter(lambda v: str(v) in keep, input_columns=script_args.filter_column)
        if len(ds) == 0:
            raise ValueError(f"--filter_column {script_args.filter_column} --filter_values {sorted(keep)} left no rows")
    if script_args.prompt_column != "prompt":
        suffix = script_args.prompt_suffix
        ds = ds.map(lambda t: {"prompt": [{"role": "user", "content": t + suffix}]},
                    input_columns=script_args.prompt_column)
    if script_args.solution_column != "solution" and script_args.solution_column in ds.column_names:
        if "solution" in ds.column_names:
            ds = ds.remove_columns("solution")
        ds = ds.rename_column(script_args.solution_column, "solution")
    if "accuracy_reward" in (script_args.reward_funcs or []):  # it would score every completion of such a row 0
        check_no_none(ds, "solution", f"dataset {name!r} has no gold answer there; drop those rows (e.g. filter on "
                      "--filter_column) or point --solution_column at the gold-answer column")
    return ds


def model_name_or_path(model_args: ModelConfig) -> str:
    """The model to train: ``--model_name_or_path``, or the shipped tiny default."""
    return model_args.model_name_or_path or DEFAULT_MODEL_PATH


def model_init_kwargs(model_args: ModelConfig, training_args) -> dict:
    """``training_args.model_init_kwargs`` merged with ModelConfig's dtype / attention / revision options."""
    kwargs = {"revision": model_args.model_revision, "attn_implementation": model_args.attn_implementation}
    if model_args.dtype is not None:
        kwargs["dtype"] = model_args.dtype
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    kwargs.update(training_args.model_init_kwargs or {})
    return kwargs


def run_training(trainer_cls, config_cls, default_config: str | Path | None = None, argv: list[str] | None = None):
    """What every ``examples/train_<algorithm>.py`` does, top to bottom: parse (YAML + flags), load the data and
    rewards, build the trainer, train, save, push."""
    from trl import get_peft_config

    script_args, training_args, model_args = parse_args(config_cls, default_config=default_config, argv=argv)
    check_model_reference(model_name_or_path(model_args), "--model_name_or_path")  # before the data and model load
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    train_dataset, eval_dataset = load_datasets(script_args, training_args)
    trainer = trainer_cls(
        model=model_name_or_path(model_args),
        reward_funcs=get_reward_funcs(script_args.reward_funcs),
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=get_peft_config(model_args),
    )
    train_and_save(trainer, training_args, script_args)
    return trainer


def train_and_save(trainer, training_args, script_args):
    """Train (resuming when asked), save the final model and card, push to the Hub when asked."""
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    dataset_name = None if script_args.dataset_name == EMBEDDED else script_args.dataset_name  # None: no Hub link
    hub_id = training_args.hub_model_id
    model_name = hub_id.split("/")[-1] if hub_id else Path(training_args.output_dir).name
    trainer.create_model_card(model_name=model_name, dataset_name=dataset_name)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=dataset_name, model_name=model_name)
    trainer.accelerator.print(f"model saved to {training_args.output_dir} "
                              f"(trained on {trainer.accelerator.num_processes} process(es))")
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()  # finishes trackers and destroys the process group (Gloo aborts at exit otherwise)
