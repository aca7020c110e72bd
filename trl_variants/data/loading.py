"""Loading the data of a run: the embedded task, a Hub id or local path (``datasets.load_dataset`` /
``load_from_disk``), or a mixture (TRL's ``get_dataset``); split slices, the evaluation split, and the checks of
TRL's ``grpo.py`` dataset flags. The prompt column is prepared by :mod:`trl_variants.data.prompts`."""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace

from .arguments import EMBEDDED, DataScriptArguments
from .prompts import filter_prompt_length, prepare_columns


def load_default_dataset(*args, **kwargs):
    """:func:`trl_variants.default.load_default_dataset` (the embedded task), imported on first use so that the command
    line's light paths (``--help``, ``recipes``) load no datasets library."""
    from ..default import load_default_dataset as load

    return load(*args, **kwargs)


def uses_embedded(script_args: DataScriptArguments) -> bool:
    """True when the data is the shipped synthetic task (no ``dataset_name``, no ``datasets`` mixture)."""
    return (script_args.dataset_name or EMBEDDED) == EMBEDDED and not getattr(script_args, "datasets", None)


def load_datasets(script_args: DataScriptArguments, training_args=None, tokenizer=None):
    """``(train_dataset, eval_dataset or None)`` per the script arguments. ``tokenizer``: the model's, needed by
    ``--filter_prompt_length``."""
    check_dataset_flags(script_args)
    if script_args.filter_prompt_length is not None and tokenizer is None:
        raise ValueError("--filter_prompt_length counts prompt tokens with the model's tokenizer: pass it "
                         "(load_datasets(..., tokenizer=AutoTokenizer.from_pretrained(model)))")
    name = script_args.dataset_name or EMBEDDED
    if script_args.datasets:
        from trl import get_dataset

        name = "mixture of " + ", ".join(d.path for d in script_args.datasets)
        ds = get_dataset(script_args)  # TRL's loader: DatasetDict(train[, test with test_split_size])
    elif name == EMBEDDED:
        ds = load_default_dataset(
            script_args.embedded_train_size, script_args.embedded_test_size, seed=script_args.embedded_seed
        )
    elif os.path.isdir(name) and any((Path(name) / f).exists() for f in ("dataset_dict.json", "state.json")):
        from datasets import load_from_disk

        ds = load_from_disk(name)
    else:
        from datasets import load_dataset

        ds = load_dataset(name, name=script_args.dataset_config)
    if not hasattr(ds, "keys"):  # a single Dataset
        train, test = ds, None
    else:
        train = _split(ds, script_args.dataset_train_split, name, "--dataset_train_split")
        test = _split(ds, script_args.dataset_test_split, name, None)
    train = prepare_columns(train, script_args, name)
    test = None if test is None else prepare_columns(test, script_args, name)
    wants_eval = training_args is not None and getattr(training_args, "eval_strategy", "no") != "no"
    test = test if wants_eval else None
    if script_args.filter_prompt_length is not None:
        kwargs = getattr(training_args, "chat_template_kwargs", None)
        train = filter_prompt_length(train, tokenizer, script_args.filter_prompt_length, kwargs)
        if test is not None:
            test = filter_prompt_length(test, tokenizer, script_args.filter_prompt_length, kwargs, "eval")
    return train, test


_SPLIT_SLICE = re.compile(r"^(.+)\[(-?\d*):(-?\d*)\]$")


def _split(ds, split: str, name: str, flag: str | None):
    """Split ``split`` of the DatasetDict ``ds``, optionally sliced by rows as ``datasets`` writes it
    (``train[:64]``, ``train[100:200]``: a smoke run on part of the data). ``flag``: the option that named it (a
    missing split is then an error naming it; without, None)."""
    match = _SPLIT_SLICE.match(split)
    base = match.group(1) if match else split
    if base not in ds:
        if flag is None:
            return None
        raise ValueError(f"dataset {name!r} has no split {base!r} (splits: {list(ds)}); set {flag} (a split, "
                         "optionally sliced: train[:64])")
    part = ds[base]
    if match:
        start, stop = (int(v) if v else None for v in match.group(2, 3))
        rows = range(len(part))[start:stop]
        if not rows:
            raise ValueError(f"dataset {name!r}: {flag or 'split'} {split!r} selects no rows of {base!r} "
                             f"({len(part)} rows)")
        part = part.select(rows)
    return part


def check_dataset_flags(script_args: DataScriptArguments) -> None:
    """Refuse the dataset flags of TRL's ``grpo.py`` that the examples do not support, naming the flag and why."""
    if script_args.dataset_streaming or script_args.streaming:
        flag = "--dataset_streaming" if script_args.dataset_streaming else "--streaming"
        raise ValueError(f"{flag} is not supported: the examples check every row before the model loads, and the "
                         "offline passes of ERPO, DPH-RL and A*-PO read every prompt before training. Load the "
                         f"dataset without {flag}; for part of a large dataset, list it under `datasets:` in the YAML "
                         "with a split slice such as `split: train[:50000]`")
    if script_args.datasets and (script_args.dataset_name or EMBEDDED) != EMBEDDED:
        raise ValueError(f"both --datasets (a mixture) and --dataset_name {script_args.dataset_name!r} are given: "
                         "give one (TRL's grpo.py would ignore --dataset_name with a warning)")
    if script_args.ignore_bias_buffers:
        raise ValueError("--ignore_bias_buffers has no effect in GRPO training (TRL's grpo.py ignores it too; it is "
                         "a DDP workaround of TRL's DPO script): remove it")


def load_eval_dataset(script_args, tokenizer=None, chat_template_kwargs: dict | None = None):
    """The evaluation split: the embedded task's fixed test split, or ``dataset_test_split`` of the dataset, with
    the same columns, prompt templating and checks as the train split; ``tokenizer`` counts prompt tokens for
    ``--filter_prompt_length`` (evaluate: the first of ``--models``). A benchmark with a test split only (MATH-500)
    loads: the train split is not read."""
    import copy

    if not uses_embedded(script_args) and not getattr(script_args, "datasets", None):
        script_args = copy.copy(script_args)  # load_datasets needs a train split: the test split stands in
        script_args.dataset_train_split = script_args.dataset_test_split
    _, test = load_datasets(script_args, SimpleNamespace(eval_strategy="steps",
                                                         chat_template_kwargs=chat_template_kwargs), tokenizer)
    if test is None:
        raise ValueError(f"dataset {script_args.dataset_name!r} has no split {script_args.dataset_test_split!r}: set "
                         "--dataset_test_split")
    return test

