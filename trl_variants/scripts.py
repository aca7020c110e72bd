"""Plumbing shared by the example scripts (``examples/train_*.py``) and the ``trl-variants`` CLI.

Arguments are parsed the TRL way: ``TrlParser`` over (script arguments, the trainer's config, ``ModelConfig``), a
``--config file.yaml`` supplying values and command-line flags overriding them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, TrlParser

from ._validation import check_model_reference, check_no_none, ensure_pad_token
from .registry import REGISTRY, method_classes
from .rewards import REWARD_FUNCS


def load_default_dataset(*args, **kwargs):
    """:func:`trl_variants.default.load_default_dataset` (the embedded task), imported on first use so that the command
    line's light paths (``--help``, ``recipes``) load no datasets library."""
    from .default import load_default_dataset as load

    return load(*args, **kwargs)


EMBEDDED = "embedded"
"""``dataset_name`` value (the default) selecting the shipped synthetic math task."""


TRL_REWARD_FUNCS = ("reasoning_accuracy_reward", "think_format_reward", "get_soft_overlong_punishment")
"""Registry names of TRL's ``grpo.py`` that resolve to ``trl.rewards`` (``accuracy_reward`` is this package's)."""


@dataclass
class DataScriptArguments(ScriptArguments, DatasetMixtureConfig):
    """Dataset and reward options shared by the example scripts and ``trl-variants presample`` / ``evaluate``: TRL's
    ``grpo.py`` script arguments (``ScriptArguments``, ``reward_model_name_or_path``, ``reward_funcs``) and dataset
    mixtures (``DatasetMixtureConfig``), plus ours. The training-only options are :class:`TrainScriptArguments`'.

    ``dataset_name``: a Hub id or local path loaded with ``datasets.load_dataset`` (``load_from_disk`` for a saved
    dataset directory, e.g. the output of ``trl-variants presample``), or ``"embedded"`` for the shipped synthetic
    task. ``datasets`` (a YAML list of ``DatasetConfig``, or ``--datasets path ...``) loads a mixture with TRL's
    ``get_dataset`` instead. The data needs a ``prompt`` column and the gold column the reward functions read
    (``solution``). The prompt can be re-templated (``prompt_format``, ``prompt_regex``, ``prompt_suffix``,
    ``system_prompt``) and filtered by length (``filter_prompt_length``) to match a paper's recipe
    (docs/recipes.md).
    """

    dataset_name: str | None = field(default=EMBEDDED, metadata={"help": "Hub id, local path or 'embedded'."})
    embedded_train_size: int = field(default=2000, metadata={"help": "Training prompts of the embedded task."})
    embedded_test_size: int = field(default=500, metadata={"help": "Held-out prompts of the embedded task."})
    embedded_seed: int = field(default=0, metadata={"help": "Seed of the embedded task's training split."})
    reward_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Reward model (Hub id or local path of a sequence-classification model, num_labels=1) used "
                          "as a reward function, before --reward_funcs, as in TRL's grpo.py."},
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={"help": f"Reward functions: {sorted(REWARD_FUNCS)}, TRL's {list(TRL_REWARD_FUNCS)} or a dotted "
                          "import path ('pkg.mod.func'). Default: accuracy_reward, or none when "
                          "--reward_model_name_or_path is given."},
    )
    prompt_column: str = field(
        default="prompt",
        metadata={"help": "Column with the prompt. A string column other than 'prompt' is turned into a "
                          "conversational 'prompt' (one user message: the text plus prompt_suffix); see "
                          "--prompt_format for a string column named 'prompt' and for plain text."},
    )
    prompt_suffix: str = field(default="", metadata={"help": "Appended to the prompt text (string columns)."})
    prompt_format: str = field(
        default="auto",
        metadata={"help": "How a string prompt column reaches the model. 'chat': one user message (under the model's "
                          "chat template); 'plain': the text itself (TRL applies no chat template to string "
                          "prompts); 'auto': 'chat', except a column named 'prompt' with no --prompt_suffix, "
                          "--prompt_regex or --system_prompt, which is passed on unchanged (plain). A "
                          "conversational column is always passed on (with --system_prompt prepended).",
                  "choices": ["auto", "chat", "plain"]},
    )
    prompt_regex: str | None = field(
        default=None,
        metadata={"help": "Regular expression with one capture group applied to a string prompt column (full match, "
                          "DOTALL): the group is the prompt text, e.g. the problem inside a dataset's own "
                          "instruction wrapper. A row that does not match is an error."},
    )
    system_prompt: str | None = field(
        default=None,
        metadata={"help": "System message prepended to every conversational prompt (e.g. DPH-RL's 'Please reason "
                          "step by step, and put your final answer within \\boxed{}.'). Not with "
                          "--prompt_format plain."},
    )
    filter_prompt_length: int | None = field(
        default=None,
        metadata={"help": "Drop training (and eval) prompts longer than this many tokens of the model's tokenizer, "
                          "counted as the trainer tokenizes them (chat template applied to conversational prompts); "
                          "prints how many were dropped. Default: keep all (TRL 1.16's GRPOConfig has no "
                          "max_prompt_length; the offline passes' max_prompt_length truncates, it does not drop)."},
    )
    solution_column: str = field(default="solution", metadata={"help": "Gold-answer column (renamed 'solution')."})
    filter_column: str | None = field(default=None, metadata={"help": "Keep only rows whose column value ..."})
    filter_values: list[str] | None = field(default=None, metadata={"help": "... is one of these (as strings)."})
    torch_threads: int | None = field(
        default=None, metadata={"help": "torch.set_num_threads for CPU runs (default: torch's choice)."}
    )

    def __post_init__(self):
        super().__post_init__()  # DatasetMixtureConfig: YAML dicts -> DatasetConfig
        if self.reward_funcs is None:  # TRL's grpo.py has no default; ours keeps the math reward unless a model scores
            self.reward_funcs = [] if self.reward_model_name_or_path else ["accuracy_reward"]
        if self.prompt_format not in ("auto", "chat", "plain"):
            raise ValueError(f"--prompt_format must be 'auto', 'chat' or 'plain', got {self.prompt_format!r}")
        if self.prompt_format == "plain" and self.system_prompt:
            raise ValueError("--system_prompt needs a conversational prompt, but --prompt_format is 'plain' (no chat "
                             "template, so no system role): drop one of them, or put the text in --prompt_suffix")
        if self.prompt_regex is not None:
            try:
                groups = re.compile(self.prompt_regex).groups
            except re.error as e:
                raise ValueError(f"--prompt_regex {self.prompt_regex!r} is not a valid regular expression: {e}") from e
            if groups != 1:
                raise ValueError(f"--prompt_regex must have exactly one capture group (the prompt text), "
                                 f"{self.prompt_regex!r} has {groups}")
        if self.filter_prompt_length is not None and self.filter_prompt_length < 1:
            raise ValueError(f"--filter_prompt_length must be >= 1 (or unset to keep every prompt), got "
                             f"{self.filter_prompt_length}")


@dataclass
class TrainScriptArguments(DataScriptArguments):
    """The example scripts' options: :class:`DataScriptArguments` and the held-out evaluation during training."""

    heldout_eval_steps: int = field(
        default=0,
        metadata={"help": "Embedded task only: held-out accuracy (greedy and avg@k at the training temperature, on "
                          "the test split) before training, every N steps and at the end; prints base vs trained and "
                          "writes heldout.json and heldout_curves.png to output_dir. 0: off. With other data it is "
                          "an error when set on the command line or in your --config YAML; the example's own default "
                          "YAML (used when no --config is given) sets it for the embedded task only, and it is "
                          "turned off, with a note, when --dataset_name / --datasets name other data."},
    )
    heldout_k: int = field(default=4, metadata={"help": "Samples per held-out prompt for avg@k."})
    keep_recipe_batch: bool = field(
        default=True,
        metadata={"help": "A recipe whose header states `# processes: N` launched on another process count keeps its "
                          "global batch: gradient_accumulation_steps and steps_per_generation (or else the per-device "
                          "batch sizes) are rescaled, with a printed line, or the run is refused where no whole "
                          "numbers keep it. Off when batch flags are given on the command line. false: the per-device "
                          "values as written (the global batch scales with the process count)."},
    )


class Parser(TrlParser):
    """TRL's ``TrlParser`` as every ``trl-variants`` command parses (``train``, ``presample``, ``evaluate``): a YAML
    list option given one value without brackets (``parts: erpo_query_kl``, ``temperatures: 1.0``) is that one item,
    not its characters; a mistyped flag or a value of the wrong type raises a ``ValueError`` naming the flag (and
    the closest known flags), which ``trl-variants`` prints as one line, checked before any dataclass is built."""

    def set_defaults_with_config(self, **kwargs) -> list[str]:
        lists = {a.dest for a in self._actions if a.nargs in ("+", "*")}
        kwargs = {k: [v] if k in lists and v is not None and not isinstance(v, list | tuple) else v
                  for k, v in kwargs.items()}
        return super().set_defaults_with_config(**kwargs)

    def error(self, message: str):
        """argparse's error (a wrong value type, a missing value): raised, not printed with the whole usage."""
        raise ValueError(f"{message} (`{self.prog} --help` lists every option with its type)")

    def unknown_flags_message(self, unknown: list[str]) -> str:
        import difflib

        known = list(dict.fromkeys("--" + o[2:].replace("-", "_") for a in self._actions for o in a.option_strings
                                   if o.startswith("--")))
        flags = [u for u in unknown if u.startswith("-")] or unknown
        hints = []
        for flag in flags:
            name = "--" + flag.split("=", 1)[0].lstrip("-").replace("-", "_")
            close = difflib.get_close_matches(name, known, n=2, cutoff=0.75)
            if close:
                hints.append(f"{flag}: did you mean {' or '.join(close)}?")
        return (f"unknown option{'s' if len(flags) > 1 else ''} {' '.join(flags)}"
                + (f" ({'; '.join(hints)})" if hints else "")
                + f": `{self.prog} --help` lists the options")

    def parse_args_into_dataclasses(self, args=None, return_remaining_strings=False, **kwargs):
        if not return_remaining_strings and args is not None:
            _, unknown = self.parse_known_args(args=list(args))
            if unknown:
                raise ValueError(self.unknown_flags_message(unknown))
        return super().parse_args_into_dataclasses(args=args, return_remaining_strings=return_remaining_strings,
                                                   **kwargs)


def _own_fields(config_cls) -> list[str]:
    """The fields a method's config adds to GRPOConfig (its own options), in their order."""
    import dataclasses

    from trl import GRPOConfig

    grpo = {f.name for f in dataclasses.fields(GRPOConfig)}
    return [f.name for f in dataclasses.fields(config_cls) if f.name not in grpo]


def _first_paragraph(doc: str | None) -> str:
    import inspect

    text = inspect.cleandoc(doc or "").split("\n\n", 1)[0]
    return " ".join(text.replace("[`", "").replace("`]", "").replace("``", "").split())


def method_parser(config_cls, prog: str | None = None, recipe: str | Path | None = None) -> Parser:
    """The parser of a training command. Its help starts with what the method is (the first paragraph of the config
    class's docstring) and the method's own options (the fields its config adds to GRPOConfig), then the rest; the
    options the YAML ``recipe`` sets show its value as "(recipe NAME: value)" instead of "(default: ...)"."""
    own = _own_fields(config_cls)
    recipe_keys, recipe_label = set(), None
    if recipe is not None and os.path.isfile(recipe):
        import yaml

        try:
            loaded = yaml.safe_load(Path(recipe).read_text())
        except yaml.YAMLError:
            loaded = None  # TrlParser reports it
        recipe_keys = set(loaded) if isinstance(loaded, dict) else set()
        path = Path(recipe)
        recipe_label = recipe_name(path) if path.resolve().is_relative_to(RECIPES_DIR) else str(recipe)
    import textwrap

    paragraphs = [_first_paragraph(config_cls.__doc__)]
    if recipe_label:
        paragraphs.append(f"Defaults: an option the recipe {recipe_label} sets shows its value as \"(recipe "
                          f"{recipe_label}: value)\"; \"(default: value)\" is the config class's own default. Flags "
                          "override both.")
    description = "\n\n".join(textwrap.fill(p, 100) for p in paragraphs)
    parser = Parser((TrainScriptArguments, config_cls, ModelConfig), prog=prog, description=description,
                    usage=f"{prog or 'train'} [--config RECIPE] [--option value ...]",
                    formatter_class=_HelpFormatter)
    for action in parser._actions:
        if action.dest in recipe_keys and f"--{action.dest}" in action.option_strings:
            action.help = f"{action.help or ''} (recipe {recipe_label}: %(default)s)".strip()
    if own:
        group = parser.add_argument_group(f"{config_cls.__name__} options (what it adds to GRPOConfig)")
        for action in list(parser._optionals._group_actions):
            if action.dest in own:
                parser._optionals._group_actions.remove(action)
                group._group_actions.append(action)
        parser._action_groups.remove(group)
        parser._action_groups.insert(0, group)
        parser._optionals.title = "other options (data, rewards, GRPOConfig, ModelConfig)"
    return parser


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """HfArgumentParser's formatter, its "(default: ...)" left off where the help gives the recipe's value; the
    description keeps its paragraphs."""

    def _get_help_string(self, action):
        return action.help if "%(default)" in (action.help or "") else super()._get_help_string(action)


def parse_args(config_cls, default_config: str | Path | None = None, argv: list[str] | None = None,
               prog: str | None = None):
    """``(script_args, training_args, model_args)`` from the command line; ``default_config`` is used as
    ``--config`` when none is given (so an example runs with no arguments). The held-out evaluation of the default
    YAML (``heldout_eval_steps``, made for the embedded task) applies only to the embedded task: with other data it
    is turned off here, with a note. Set anywhere else (a flag, the user's own YAML) with other data, it is refused by
    :func:`run_training` (:func:`check_heldout_flags`, naming where it was set)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    origin = heldout_origin(argv, default_config)
    if default_config is not None and "--config" not in argv:
        argv = ["--config", str(default_config), *argv]
    parser = method_parser(config_cls, prog=prog, recipe=_config_argument(argv, None))
    script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    if origin.startswith("default config "):
        check_heldout_flags(script_args, origin)
    if script_args.torch_threads:
        import torch

        torch.set_num_threads(script_args.torch_threads)
    return script_args, training_args, model_args


def get_reward_funcs(names: list[str], allow_empty: bool = False):
    """Reward callables by registry name (``accuracy_reward``, ``format_reward``, TRL's :data:`TRL_REWARD_FUNCS`)
    or dotted import path. ``allow_empty``: no names is fine (a reward model scores instead)."""
    if not names and not allow_empty:
        raise ValueError("reward_funcs is empty: give at least one, e.g. --reward_funcs accuracy_reward, or a reward "
                         "model with --reward_model_name_or_path")
    funcs = []
    for name in names:
        if name in REWARD_FUNCS:
            funcs.append(REWARD_FUNCS[name])
        elif name in TRL_REWARD_FUNCS:
            import trl.rewards

            func = getattr(trl.rewards, name)
            # the values TRL's grpo.py registers it with
            funcs.append(func(max_completion_len=1280, soft_punish_cache=256)
                         if name == "get_soft_overlong_punishment" else func)
        elif "." in name:
            module, attr = name.rsplit(".", 1)
            sys.path.insert(0, os.getcwd())
            funcs.append(getattr(importlib.import_module(module), attr))
        else:
            raise ValueError(f"unknown reward function {name!r}: use one of "
                             f"{sorted(REWARD_FUNCS) + list(TRL_REWARD_FUNCS)} or 'pkg.module.func'")
    return funcs


def load_reward_model(path: str, chat_template_kwargs: dict | None = None, device=None):
    """A reward model as the offline pass and ``trl-variants presample`` / ``evaluate`` call it: loaded as
    GRPOTrainer loads ``reward_funcs=[path]`` (``AutoModelForSequenceClassification``, ``num_labels=1``, its own
    tokenizer, EOS as pad token when it has none) and wrapped in :class:`~trl_variants.presample.reward_calls.
    RewardModelReward`, which scores as GRPOTrainer does."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from .presample.reward_calls import RewardModelReward

    check_model_reference(path, "--reward_model_name_or_path")
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1).eval()
    tokenizer = ensure_pad_token(AutoTokenizer.from_pretrained(path))
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id  # it scores the last non-pad token
    return RewardModelReward(model.to(device) if device is not None else model, tokenizer, chat_template_kwargs)


def load_reward_funcs(script_args: TrainScriptArguments, device=None, chat_template_kwargs: dict | None = None):
    """The reward model (first, as in TRL's grpo.py) and reward functions of the script arguments, all as callables
    (for ``trl-variants presample`` / ``evaluate``; a trainer loads the model itself from its path)."""
    funcs = []
    if script_args.reward_model_name_or_path:
        funcs.append(load_reward_model(script_args.reward_model_name_or_path, chat_template_kwargs, device))
    return funcs + get_reward_funcs(script_args.reward_funcs, allow_empty=bool(funcs))


def uses_embedded(script_args: TrainScriptArguments) -> bool:
    """True when the data is the shipped synthetic task (no ``dataset_name``, no ``datasets`` mixture)."""
    return (script_args.dataset_name or EMBEDDED) == EMBEDDED and not getattr(script_args, "datasets", None)


def load_datasets(script_args: TrainScriptArguments, training_args=None, tokenizer=None):
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
    train = _prepare_columns(train, script_args, name)
    test = None if test is None else _prepare_columns(test, script_args, name)
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


def check_dataset_flags(script_args: TrainScriptArguments) -> None:
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
    ds = _template_prompts(ds, script_args, name)
    if script_args.solution_column != "solution" and script_args.solution_column in ds.column_names:
        if "solution" in ds.column_names:
            ds = ds.remove_columns("solution")
        ds = ds.rename_column(script_args.solution_column, "solution")
    if "accuracy_reward" in (script_args.reward_funcs or []):  # it would score every completion of such a row 0
        check_no_none(ds, "solution", f"dataset {name!r} has no gold answer there; drop those rows (e.g. filter on "
                      "--filter_column) or point --solution_column at the gold-answer column")
    return ds


def _template_prompts(ds, script_args: TrainScriptArguments, name: str):
    """The ``prompt`` column per ``--prompt_format`` / ``--prompt_regex`` / ``--prompt_suffix`` / ``--system_prompt``:
    a string column becomes one user message (``chat``, after an optional system message) or stays a string
    (``plain``: GRPOTrainer then tokenizes it without the chat template); a conversational column is kept, with the
    system message prepended."""
    column, a = script_args.prompt_column, script_args
    if not len(ds):
        return ds
    if not isinstance(ds[0][column], str):  # conversational: a list of messages
        if a.prompt_format == "plain" or a.prompt_regex or a.prompt_suffix:
            raise ValueError(f"dataset {name!r}: column {column!r} is already conversational (a list of messages); "
                             "--prompt_format plain, --prompt_regex and --prompt_suffix apply to a string column: "
                             "drop them or point --prompt_column at the text column")
        if a.system_prompt:
            system = {"role": "system", "content": a.system_prompt}
            ds = ds.map(lambda m: {"prompt": m if m and m[0]["role"] == "system" else [system, *m]},
                        input_columns=column)
        elif column != "prompt":
            ds = ds.map(lambda m: {"prompt": m}, input_columns=column)
        return ds
    fmt = a.prompt_format
    if fmt == "auto":
        untouched = column == "prompt" and not (a.prompt_suffix or a.prompt_regex or a.system_prompt)
        fmt = "plain" if untouched else "chat"
    pattern = re.compile(a.prompt_regex, re.DOTALL) if a.prompt_regex else None

    def text(t: str) -> str:
        if pattern is not None:
            t = pattern.fullmatch(t).group(1)
        return t + a.prompt_suffix

    if pattern is not None:
        unmatched = [i for i, t in enumerate(ds[column]) if pattern.fullmatch(t) is None]
        if unmatched:
            raise ValueError(f"dataset {name!r}: --prompt_regex does not match {len(unmatched)} of {len(ds)} rows of "
                             f"{column!r} (first: row {unmatched[0]}, {ds[unmatched[0]][column][:120]!r}); fix the "
                             "pattern or filter those rows out")
    if fmt == "plain":
        if column == "prompt" and pattern is None and not a.prompt_suffix:
            return ds
        return ds.map(lambda t: {"prompt": text(t)}, input_columns=column)
    system = [{"role": "system", "content": a.system_prompt}] if a.system_prompt else []
    return ds.map(lambda t: {"prompt": [*system, {"role": "user", "content": text(t)}]}, input_columns=column)


def prompt_lengths(ds, tokenizer, chat_template_kwargs: dict | None = None) -> list[int]:
    """Tokens of each ``prompt`` as GRPOTrainer tokenizes it (the chat template with the generation prompt for a
    conversational prompt, the tokenizer on the text otherwise)."""
    from .generation import tokenize_prompts

    return [len(ids) for ids in tokenize_prompts(tokenizer, ds["prompt"], None, chat_template_kwargs)]


def filter_prompt_length(ds, tokenizer, max_length: int, chat_template_kwargs: dict | None = None, what: str = "train"):
    """``ds`` without the prompts longer than ``max_length`` tokens (:func:`prompt_lengths`); prints the count."""
    keep = [i for i, n in enumerate(prompt_lengths(ds, tokenizer, chat_template_kwargs)) if n <= max_length]
    print(f"--filter_prompt_length {max_length}: dropped {len(ds) - len(keep)} of {len(ds)} {what} prompts longer "
          f"than {max_length} tokens, {len(keep)} left")
    if not keep:
        raise ValueError(f"--filter_prompt_length {max_length} left no {what} prompts: raise it")
    return ds.select(keep) if len(keep) < len(ds) else ds


MODEL_SHORTHANDS = ("tiny", "default")
"""``--model_name_or_path`` (train) and ``--models`` / ``--base_model`` / ``--reference_model`` (evaluate) values naming
the shipped tiny model (when no local path of that name exists)."""


def model_path(value: str | None) -> str | None:
    """A model option's value with the shorthands resolved: ``tiny`` / ``default`` name the shipped tiny model
    (:data:`~trl_variants.default.DEFAULT_MODEL_PATH`) unless a local path of that name exists."""
    from pathlib import Path

    from .default import DEFAULT_MODEL_PATH

    if value in MODEL_SHORTHANDS and not Path(value).exists():
        return DEFAULT_MODEL_PATH
    return value


def model_name_or_path(model_args: ModelConfig) -> str:
    """The model to train: ``--model_name_or_path`` (``tiny`` / ``default``: the shipped tiny model, see
    :func:`model_path`), or the shipped tiny default."""
    from .default import DEFAULT_MODEL_PATH

    return model_path(model_args.model_name_or_path) or DEFAULT_MODEL_PATH


def model_init_kwargs(model_args: ModelConfig, training_args) -> dict:
    """``training_args.model_init_kwargs`` merged with ModelConfig's dtype / attention / revision options (GRPOTrainer
    adds ``trust_remote_code`` from the training arguments, as TRL's grpo.py does)."""
    kwargs = {"revision": model_args.model_revision, "attn_implementation": model_args.attn_implementation}
    if model_args.dtype is not None:
        kwargs["dtype"] = model_args.dtype
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    kwargs.update(training_args.model_init_kwargs or {})
    return kwargs


# ModelConfig options that only act together with another flag: TRL's scripts ignore them without it; we refuse.
_NEEDS_FLAG = {
    "use_peft": ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_target_parameters",
                 "lora_modules_to_save", "lora_task_type", "use_rslora", "use_dora", "load_in_4bit", "load_in_8bit"),
    "load_in_4bit": ("bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage"),
}


def check_model_flags(model_args: ModelConfig) -> None:
    """Refuse ModelConfig flags that would be ignored (an option set without the flag that enables it), naming the
    flag and the fix."""
    defaults = ModelConfig()  # (both --load_in_4bit and --load_in_8bit: ModelConfig itself refuses them)
    for switch, options in _NEEDS_FLAG.items():
        if getattr(model_args, switch):
            continue
        for option in options:
            if getattr(model_args, option) != getattr(defaults, option):
                why = (" (a quantized model cannot be trained directly: QLoRA trains LoRA adapters on it)"
                       if option.startswith("load_in") else "")
                raise ValueError(f"--{option} only acts with --{switch}, which is not set{why}: add --{switch} or "
                                 f"drop --{option}")


def quantization_config(model_args: ModelConfig):
    """The ``BitsAndBytesConfig`` of ``--load_in_4bit`` / ``--load_in_8bit`` built by TRL's own
    ``get_quantization_config`` (None without them). Checked here with transformers' own quantizer check (the one
    ``from_pretrained`` runs), so a machine where bitsandbytes cannot run fails now, naming the flag, not after the
    data has loaded, and never trains unquantized."""
    from transformers.quantizers import AutoHfQuantizer
    from trl import get_quantization_config

    config = get_quantization_config(model_args)
    if config is None:
        return None
    flag = "--load_in_4bit" if model_args.load_in_4bit else "--load_in_8bit"
    try:
        AutoHfQuantizer.from_config(config).validate_environment(device_map=None)
    except (ImportError, RuntimeError) as e:
        raise ValueError(f"{flag} quantizes the model with bitsandbytes, which cannot run here ({e}). Fix: run on a "
                         "machine where it can (a CUDA GPU, with `pip install bitsandbytes`), or drop "
                         f"{flag} to train the unquantized model (with --use_peft: plain LoRA). Nothing was "
                         "loaded") from e
    return config


def trainer_kwargs(script_args: TrainScriptArguments, training_args, model_args: ModelConfig) -> dict:
    """The keyword arguments of the trainer, built as TRL's grpo.py builds GRPOTrainer's (reward model path first
    in ``reward_funcs``, ``quantization_config`` and ``peft_config`` from TRL's helpers). Every flag is checked
    before anything loads, and what the run needs (:func:`check_prerequisites`: extras, tracker login, Hub id and
    token, the checkpoint to resume); the datasets load here, the models in the trainer."""
    from trl import get_peft_config

    check_prerequisites(training_args)
    check_model_flags(model_args)
    check_dataset_flags(script_args)
    quantization = quantization_config(model_args)
    check_model_reference(model_name_or_path(model_args), "--model_name_or_path")
    reward_funcs = []
    if script_args.reward_model_name_or_path:  # a path: GRPOTrainer loads it (num_labels=1) and its tokenizer
        check_model_reference(script_args.reward_model_name_or_path, "--reward_model_name_or_path")
        reward_funcs.append(script_args.reward_model_name_or_path)
    reward_funcs += get_reward_funcs(script_args.reward_funcs, allow_empty=bool(reward_funcs))
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    tokenizer = None
    if script_args.filter_prompt_length is not None:  # the tokenizer GRPOTrainer will load for the model
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_name_or_path(model_args), revision=model_args.model_revision,
                                                  trust_remote_code=training_args.trust_remote_code)
    train_dataset, eval_dataset = load_datasets(script_args, training_args, tokenizer)
    return dict(model=model_name_or_path(model_args), reward_funcs=reward_funcs, args=training_args,
                train_dataset=train_dataset, eval_dataset=eval_dataset, quantization_config=quantization,
                peft_config=get_peft_config(model_args))


# --- before anything loads: the recipe's batch on this process count, what the run needs, the checkpoint ---------

BATCH_FLAGS = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
               "generation_batch_size", "pef_batch_size")
"""The fields that size a run's batch. Given on the command line, they decide it: :func:`recipe_batch` then rescales
nothing (``scripts/slurm_train.sh`` passes its own rescaled values this way, so nothing is rescaled twice)."""

_PROCESSES_LINE = re.compile(r"^#\s*processes:\s*(\d+)")


def recipe_processes(path: str | Path) -> int | None:
    """The process count a YAML's batch arithmetic is written for: its ``# processes: N`` header line (in the comment
    block that opens the file, as ``trainers_tests/examples/test_configs.py`` reads it), or None."""
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            return None
        match = _PROCESSES_LINE.match(line.strip())
        if match:
            return int(match.group(1))
    return None


def num_processes() -> int:
    """The process count of this launch, before the training arguments are parsed: accelerate's ``PartialState``
    when it is already set up, else the launcher's environment (``WORLD_SIZE``, set by ``accelerate launch`` and
    ``torchrun``; MPI's sizes), else 1. :func:`run_training` checks it against the parsed ``world_size``."""
    from accelerate import PartialState
    from accelerate.utils import get_int_from_env

    if PartialState._shared_state:
        return PartialState().num_processes
    return get_int_from_env(["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"], 1)


def _given(argv: list[str]) -> list[str]:
    """The option names of ``argv`` (``--name value``, ``--name=value``; dashes read as underscores, as
    ``HfArgumentParser`` accepts both)."""
    return [a[2:].split("=", 1)[0].replace("-", "_") for a in argv if a.startswith("--")]


def _keep_recipe_batch(argv: list[str], raw: dict) -> bool:
    """``keep_recipe_batch`` as the parser will read it (the YAML's value, a flag overriding it), read before
    parsing because the rescaled values are passed to the parser."""
    from transformers.hf_argparser import string_to_bool

    value = raw.get("keep_recipe_batch", True)
    for i, arg in enumerate(argv):
        name = arg[2:].split("=", 1)[0].replace("-", "_") if arg.startswith("--") else None
        if name == "no_keep_recipe_batch":
            value = False
        elif name == "keep_recipe_batch":
            text = (arg.split("=", 1)[1] if "=" in arg else
                    argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else "true")
            try:
                value = string_to_bool(text)
            except Exception:  # the parser refuses it, naming the flag
                pass
    return bool(value)


def _batch_values(raw: dict, config_cls) -> dict:
    """The YAML's batch fields, with the config class's defaults for those it does not set."""
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(config_cls) if f.default is not dataclasses.MISSING}
    return {name: raw.get(name, defaults.get(name)) for name in BATCH_FLAGS}


def _rescaled(values: dict, written: int, processes: int) -> list[tuple[str, int, int]] | None:
    """``[(field, recipe value, value on processes), ...]`` keeping the global batch of ``values`` (written for
    ``written`` processes) on ``processes``: gradient_accumulation_steps and steps_per_generation times
    written / processes (the per-device memory unchanged), else, on more processes, the per-device batch sizes;
    None where no whole numbers do."""
    from fractions import Fraction

    ratio = Fraction(written, processes)
    micro, generation = values["per_device_train_batch_size"], values["generation_batch_size"]
    changes = [(name, values[name], values[name] * ratio) for name in ("gradient_accumulation_steps",
                                                                      "steps_per_generation") if values[name]]
    if all(new.denominator == 1 for *_, new in changes) and (not generation or generation % (micro * processes) == 0):
        return [(name, old, int(new)) for name, old, new in changes]
    if ratio < 1:  # more processes: smaller per-device batches (slurm_train.sh's fallback)
        changes = [(name, values[name], values[name] * ratio) for name in ("per_device_train_batch_size",
                                                                          "pef_batch_size") if values[name]]
        if all(new.denominator == 1 for *_, new in changes):
            return [(name, old, int(new)) for name, old, new in changes]
    return None


def recipe_batch(config: str | Path, argv: list[str], processes: int, config_cls=None) -> tuple[list[str], str]:
    """``(flags, note)`` for a run of the YAML ``config`` with the command line ``argv`` on ``processes`` processes.
    A YAML whose header states ``# processes: N`` (the paper recipes) keeps its global batch on another process
    count: ``flags`` are the rescaled batch fields to add to the command line (:func:`_rescaled`), ``note`` the line
    with the arithmetic to print. Nothing is rescaled when the header is absent or equal, when the command line
    sets a batch field itself (:data:`BATCH_FLAGS`; then ``note`` says so) or with ``--keep_recipe_batch false``
    (the per-device values as written; ``note`` gives the changed batch). Raises ValueError, with the arithmetic,
    the process counts that keep the batch and the ways out, where no whole numbers keep it (e.g. 8 -> 3)."""
    import yaml
    from trl import GRPOConfig

    written = recipe_processes(config)
    if written is None or written == processes:
        return [], ""
    path = Path(config)
    name = recipe_name(path) if path.resolve().is_relative_to(RECIPES_DIR) else str(config)
    head = (f"{name} is written for {written} process{'es' if written > 1 else ''}, this run has {processes}")
    given = [f"--{g}" for g in dict.fromkeys(_given(argv)) if g in BATCH_FLAGS]
    if given:
        return [], f"{head}: your batch flags ({' '.join(given)}) decide the batch, nothing is rescaled"
    raw = yaml.safe_load(path.read_text()) or {}
    values = _batch_values(raw, config_cls or GRPOConfig)
    micro, accumulation = values["per_device_train_batch_size"], values["gradient_accumulation_steps"]
    generation = values["generation_batch_size"]

    def batch(v: dict, p: int) -> tuple[int, int, int]:
        """(steps per generation, completions per optimizer step, completions per rollout batch) of v on p."""
        per_generation = v["steps_per_generation"] or (generation // (v["per_device_train_batch_size"] * p)
                                                       if generation else v["gradient_accumulation_steps"])
        device = v["per_device_train_batch_size"] * p
        return per_generation, device * v["gradient_accumulation_steps"], device * per_generation

    per_generation, step, rollout = batch(values, written)
    recipe = (f"{micro}/device x {written} processes x gradient_accumulation_steps {accumulation} = {step} "
              f"completions per optimizer step, x steps_per_generation {per_generation} = {rollout} per rollout batch")
    _, own_step, own_rollout = batch(values, processes) if not generation else (0, micro * processes * accumulation,
                                                                               generation)
    as_written = (f"--keep_recipe_batch false: the per-device values as written, {micro} x {processes} x "
                  f"{accumulation} = {own_step} completions per optimizer step (the recipe's {step}), {own_rollout} "
                  f"per rollout batch (the recipe's {rollout})")
    if not _keep_recipe_batch(argv, raw):
        return [], f"{head}: {as_written}"
    changes = _rescaled(values, written, processes)
    if changes is None:
        fits = [str(p) for p in range(1, 4 * written + 1) if _rescaled(values, written, p) is not None]
        tried = ", ".join(f"{field} {values[field]} x {written}/{processes} = {values[field] * written / processes:g}"
                          for field in ("gradient_accumulation_steps", "steps_per_generation",
                                        "per_device_train_batch_size") if values[field])
        raise ValueError(
            f"{head}, and no whole numbers keep its batch ({recipe}; {tried}). Fix: launch a process count that keeps "
            f"it ({', '.join(fits)}; --num_processes), or set the batch yourself with --per_device_train_batch_size / "
            f"--gradient_accumulation_steps / --steps_per_generation (docs/distributed.md), or pass {as_written}. "
            "Nothing was loaded")
    new = {**values, **{field: value for field, _, value in changes}}
    _, new_step, new_rollout = batch(new, processes)
    assert (new_step, new_rollout) == (step, rollout), (changes, step, rollout)
    flags = [a for field, _, value in changes for a in (f"--{field}", str(value))]
    what = " and ".join(f"{field} {old} -> {value}" for field, old, value in changes)
    note = (f"{head}: {what} keep{'s' if len(changes) == 1 else ''} its batch "
            f"({new['per_device_train_batch_size']}/device x {processes} process{'es' if processes > 1 else ''} x "
            f"{new['gradient_accumulation_steps']} = {step} completions per optimizer step, x "
            f"{batch(new, processes)[0]} = {rollout} per rollout batch); --keep_recipe_batch false keeps the "
            "per-device values as written")
    return flags, note


TRACKER_PACKAGES = {"wandb": '"trl-variants[wandb]"', "trackio": '"trl-variants[trackio]"', "comet_ml": "comet-ml",
                    "azure_ml": "azureml-core", "neptune": "neptune", "tensorboard": "tensorboard"}
"""What to ``pip install`` for a ``report_to`` tracker (others: the tracker's name)."""

_PLACEHOLDER_HUB_ID = re.compile(r"^(your[-_]?[a-z]*|<[^>]*>|org|user|username)/", re.IGNORECASE)


def _wandb_logged_in() -> bool:
    """A wandb API key is at hand: ``WANDB_API_KEY``, or the netrc entry ``wandb login`` writes for the API host."""
    import netrc
    from urllib.parse import urlparse

    if os.environ.get("WANDB_API_KEY", "").strip():
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return bool(os.path.isfile(path) and netrc.netrc(path).authenticators(host))
    except (OSError, netrc.NetrcParseError):
        return False


def _uses_deepspeed(training_args) -> bool:
    """The launch asks for DeepSpeed: ``accelerate launch`` with a DeepSpeed config sets ``ACCELERATE_USE_DEEPSPEED``
    (accelerate's state reads it), or the training arguments name a DeepSpeed config."""
    from accelerate.utils import parse_flag_from_env

    return parse_flag_from_env("ACCELERATE_USE_DEEPSPEED") or bool(getattr(training_args, "deepspeed", None))


def prerequisite_problems(training_args) -> list[str]:
    """What the run needs and this machine lacks, each with its fix: an extra for ``use_vllm``, a DeepSpeed launch
    and each ``report_to`` tracker; the wandb login (unless ``WANDB_MODE`` is offline or disabled); for
    ``push_to_hub`` a real ``hub_model_id`` (not a placeholder like ``your-org/...``), a Hub token and the network;
    for ``resume_from_checkpoint`` true / last a checkpoint in output_dir; a ``presample_cache_dir`` that is a file
    (DPH-RL, A*-PO, the composed trainer's offline pass). Reads the environment only: nothing is
    imported that the run would not import, nothing loads."""
    import importlib.util

    from ._checkpoint import last_complete_checkpoint, resume_target

    problems = []
    if getattr(training_args, "use_vllm", False) and importlib.util.find_spec("vllm") is None:
        problems.append('use_vllm: true needs vLLM: pip install "trl-variants[vllm]" (on a CUDA GPU), or pass '
                        "--use_vllm false to generate with transformers")
    if _uses_deepspeed(training_args) and importlib.util.find_spec("deepspeed") is None:
        problems.append('the launch uses DeepSpeed (an accelerate config with distributed_type: DEEPSPEED, e.g. '
                        'accelerate/zero2.yaml) but deepspeed is not installed: pip install "trl-variants[deepspeed]", '
                        "or launch with another accelerate config (accelerate/multi_gpu.yaml, or none on one GPU)")
    trackers = [t for t in (training_args.report_to or []) if t not in ("none", "all")]
    if trackers:
        from transformers.integrations.integration_utils import get_available_reporting_integrations

        available = set(get_available_reporting_integrations())
        for tracker in trackers:
            if tracker not in available:
                problems.append(f"report_to: [{tracker}] needs {tracker}: pip install "
                                f"{TRACKER_PACKAGES.get(tracker, tracker)}, or pass --report_to none (or another "
                                "tracker, e.g. --report_to trackio)")
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if "wandb" in trackers and mode not in ("offline", "disabled", "dryrun") and not _wandb_logged_in():
        problems.append("report_to: [wandb] needs a wandb login: run `wandb login` (or set WANDB_API_KEY), or "
                        "WANDB_MODE=offline to log locally for a later `wandb sync`, or pass --report_to none")
    if training_args.push_to_hub:
        from huggingface_hub import constants, get_token

        hub_id = training_args.hub_model_id
        if hub_id and _PLACEHOLDER_HUB_ID.match(hub_id):
            problems.append(f"push_to_hub: true with the placeholder hub_model_id {hub_id!r}: pass --hub_model_id "
                            f"<you>/{hub_id.split('/', 1)[1]} (a repository you may write to), or --push_to_hub false")
        if get_token() is None:
            problems.append("push_to_hub: true needs a Hub token with write access: run `hf auth login` (or set "
                            "HF_TOKEN), or pass --push_to_hub false")
        if constants.HF_HUB_OFFLINE:
            problems.append("push_to_hub: true, but HF_HUB_OFFLINE is set (no network to the Hub): unset it, or pass "
                            "--push_to_hub false")
    cache = getattr(training_args, "presample_cache_dir", None)
    if cache and os.path.exists(cache) and not os.path.isdir(cache):
        problems.append(f"presample_cache_dir: {cache} is a file, not a directory (the offline pass caches its results "
                        "in a directory there): pass --presample_cache_dir DIR (created when missing), or move the "
                        "file away")
    if resume_target(training_args.resume_from_checkpoint) is True:
        try:
            last_complete_checkpoint(training_args.output_dir)
        except ValueError as e:
            problems.append(str(e))
    return problems


def check_prerequisites(training_args) -> None:
    """Refuse, in one message listing every :func:`prerequisite_problems` item with its fix, a run that would fail
    later (transformers creates the Hub repository and starts the trackers only after the model has loaded)."""
    problems = prerequisite_problems(training_args)
    if problems:
        raise ValueError(f"this run cannot start here ({len(problems)} problem{'s' if len(problems) > 1 else ''}, "
                         "checked before any data or model loads):\n" + "\n".join(f"  - {p}" for p in problems)
                         + "\nA first run without extras, logins or the Hub: --push_to_hub false --report_to none "
                         "--use_vllm false (each paper recipe's header has a `# smoke:` command)")


def where_it_runs(training_args) -> str:
    """One line: the device and process count this run trains on, the precision, and, when a recipe keeps a run on
    the CPU (the tiny recipes' ``use_cpu: true``) on a machine with a GPU, the flag that moves it there."""
    import torch

    device = training_args.device
    name = (f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device))
    precision = "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32"
    line = (f"training on {name}, {training_args.world_size} process{'es' if training_args.world_size > 1 else ''}, "
            f"{precision} compute")
    if training_args.use_cpu and torch.cuda.is_available():
        line += (f" (use_cpu: true; this machine has {torch.cuda.device_count()} GPU(s): --use_cpu false trains "
                 "there, see docs/gpu.md)")
    return line


def _config_argument(argv: list[str], default_config: str | Path | None) -> str | None:
    """The YAML of the command line: ``--config FILE`` / ``--config=FILE``, else ``default_config``."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None if default_config is None else str(default_config)


def run_training(trainer_cls, config_cls, default_config: str | Path | None = None, argv: list[str] | None = None,
                 prog: str | None = None):
    """What every ``examples/train_<algorithm>.py`` does, top to bottom: keep a recipe's batch on this process count
    (:func:`recipe_batch`), parse (YAML + flags), check every flag and what the run needs (:func:`trainer_kwargs`,
    :func:`check_prerequisites`), load the data and rewards, build the trainer, train, save, push."""
    from ._checkpoint import resume_target

    argv = list(sys.argv[1:] if argv is None else argv)
    config = _config_argument(argv, default_config)
    processes, flags = num_processes(), []
    if config is not None and os.path.isfile(config):
        flags, note = recipe_batch(config, argv, processes, config_cls)
        if note and os.environ.get("RANK", "0") == "0":
            print(note)
    script_args, training_args, model_args = parse_args(config_cls, default_config=default_config,
                                                        argv=argv + flags, prog=prog)
    if flags and training_args.world_size != processes:
        raise ValueError(f"the batch was rescaled for {processes} processes (read from the launcher's environment), "
                         f"but this run has {training_args.world_size}: pass the batch flags yourself, or "
                         "--keep_recipe_batch false")
    check_heldout_flags(script_args, heldout_origin(argv, default_config))
    if os.environ.get("RANK", "0") == "0":
        print(where_it_runs(training_args))
    training_args.resume_from_checkpoint = resume_target(training_args.resume_from_checkpoint)
    trainer = trainer_cls(**trainer_kwargs(script_args, training_args, model_args))
    if script_args.heldout_eval_steps:
        from .evaluate import HeldOutCallback

        heldout = load_default_dataset(0, script_args.embedded_test_size)["test"]
        trainer.add_callback(HeldOutCallback(trainer, heldout, k=script_args.heldout_k,
                                             eval_steps=script_args.heldout_eval_steps))
    train_and_save(trainer, training_args, script_args)
    return trainer


def heldout_origin(argv: list[str], default_config: str | Path | None = None) -> str:
    """Where ``heldout_eval_steps`` comes from for the command line ``argv`` of a script whose default YAML is
    ``default_config``: ``"command line"``, ``"config FILE"`` (the user's ``--config``), ``"default config FILE"``
    (the script's own YAML, which the user did not name) or ``"default"`` (0, off)."""
    if any(a == "--heldout_eval_steps" or a.startswith("--heldout_eval_steps=") for a in argv):
        return "command line"
    if "--config" in argv and argv.index("--config") + 1 < len(argv):
        return "config " + argv[argv.index("--config") + 1]
    return "default" if default_config is None else f"default config {default_config}"


def check_heldout_flags(script_args: TrainScriptArguments, origin: str = "command line") -> None:
    """Refuse held-out settings that cannot run, naming where they were set (``origin``, see
    :func:`heldout_origin`). The example's default YAML's held-out evaluation with data other than the embedded
    task is turned off (with a note) rather than refused: the user never asked for it."""
    steps = script_args.heldout_eval_steps
    if steps < 0 or script_args.heldout_k < 1:
        raise ValueError(f"--heldout_eval_steps must be >= 0 (got {steps}) and --heldout_k >= 1 (got "
                         f"{script_args.heldout_k})")
    if not steps or uses_embedded(script_args):
        return
    data = (repr(script_args.dataset_name) if not script_args.datasets
            else "a mixture of " + ", ".join(repr(d.path) for d in script_args.datasets))
    why = f"evaluates on the embedded task's test split, but the data is {data}"
    own_split = "evaluate with `trl-variants evaluate` (or a PassAtKCallback) on your own held-out split"
    if origin.startswith("default config "):
        path = origin.removeprefix("default config ")
        print(f"held-out evaluation off: heldout_eval_steps: {steps} (in {path}, this example's default YAML) {why}; "
              f"{own_split}")
        script_args.heldout_eval_steps = 0
    elif origin.startswith("config "):
        path = origin.removeprefix("config ")
        raise ValueError(f"heldout_eval_steps: {steps} (in {path}) {why}: remove it from {path} or pass "
                         f"--heldout_eval_steps 0, and {own_split}")
    else:
        raise ValueError(f"--heldout_eval_steps {steps} (command line) {why}: drop --heldout_eval_steps and "
                         f"{own_split}")


def train_and_save(trainer, training_args, script_args):
    """Train (resuming when asked), save the final model and card, push to the Hub when asked."""
    from .cli import training_started

    training_started()  # from here an error is a crash, with its traceback (the checkpoint was checked at construction)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    # the Hub link of the card: none for the embedded task or a mixture
    dataset_name = None if uses_embedded(script_args) or script_args.datasets else script_args.dataset_name
    hub_id = training_args.hub_model_id
    model_name = hub_id.split("/")[-1] if hub_id else Path(training_args.output_dir).name
    trainer.create_model_card(model_name=model_name, dataset_name=dataset_name)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=dataset_name, model_name=model_name)
    trainer.accelerator.print(f"model saved to {training_args.output_dir} "
                              f"(trained on {trainer.accelerator.num_processes} process(es))")
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()  # finishes trackers and destroys the process group (Gloo aborts at exit otherwise)


# --- the training commands: `trl-variants train <method>`, examples/train_<method>.py -----------------------------

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
"""The shipped YAMLs (package data): ``<method>/<name>.yaml`` training recipes and ``accelerate/<name>.yaml``
launch configs. A clone's ``configs/`` is a link to this folder."""

METHODS = {name: (m.module, m.trainer, m.config) for name, m in REGISTRY.items()}
"""``trl-variants train <method>``: the module, trainer class and config class of each method
(:data:`trl_variants.registry.REGISTRY`)."""

DEFAULT_RECIPE = "tiny_cpu"
"""Each method's default recipe (``<method>/tiny_cpu``): the embedded task on a CPU, offline."""


def default_recipe(method: str) -> Path:
    """The YAML a method trains with when no ``--config`` is given."""
    return RECIPES_DIR / method / f"{DEFAULT_RECIPE}.yaml"


def shipped_recipes(folder: str | None = None) -> list[Path]:
    """The shipped YAMLs (of one folder: a method or ``accelerate``), sorted by name."""
    return sorted(RECIPES_DIR.glob(f"{folder or '*'}/*.yaml"))


def recipe_name(path: Path) -> str:
    """``<folder>/<stem>`` of a shipped YAML (what ``--config`` accepts), e.g. ``erpo/qwen2.5-math-7b``."""
    return f"{path.parent.name}/{path.stem}"


def resolve_recipe(value: str, method: str | None = None, files: bool = True) -> Path:
    """The YAML of ``--config value``: an existing file (as before), else a shipped recipe by name:
    ``erpo/qwen2.5-math-7b`` (``.yaml`` optional), its file name ``qwen2.5-math-7b.yaml`` (looked up in ``method``'s
    folder, then in the others if only one has it), or a clone's path ``configs/erpo/qwen2.5-math-7b.yaml`` (so a
    recipe header's launch command works without a clone). ``files=False``: shipped recipes only."""
    path = Path(value).expanduser()
    if files and path.is_file():
        return path
    name = value.replace("\\", "/").removeprefix("./").removeprefix("configs/")
    for suffix in (".yaml", ".yml"):
        name = name.removesuffix(suffix)
    if "/" in name:
        found = [RECIPES_DIR / f"{name}.yaml"]
    else:
        found = [RECIPES_DIR / method / f"{name}.yaml"] if method else []
        found = [p for p in found if p.is_file()] or [p for p in shipped_recipes() if p.stem == name]
    found = [p for p in found if p.is_file()]
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise ValueError(f"{value}: several shipped recipes are named {name!r} "
                         f"({', '.join(recipe_name(p) for p in found)}); give the folder too")
    choices = [recipe_name(p) for p in shipped_recipes(method)] if method else []
    choices = choices or [recipe_name(p) for p in shipped_recipes() if p.parent.name != "accelerate"]
    raise FileNotFoundError(f"{value}: {'no such file, and ' if files else ''}no shipped recipe of that name (shipped"
                            f"{' for ' + method if method else ''}: {', '.join(choices)}; "
                            "`trl-variants recipes` lists them)")


def _with_resolved_config(argv: list[str], method: str) -> list[str]:
    """``argv`` with ``--config NAME`` (or ``--config=NAME``) replaced by the recipe's path."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            argv[i:i + 1] = ["--config", arg.split("=", 1)[1]]
            break
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ValueError("--config needs a value: a YAML path or a shipped recipe's name "
                             "(`trl-variants train --list`)")
        try:
            path = resolve_recipe(argv[i + 1], method)
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f"--config {e}") from None
        if str(path) != argv[i + 1] and os.environ.get("RANK", "0") == "0":
            print(f"--config {argv[i + 1]}: the shipped recipe {recipe_name(path)} ({path})")
        argv[i + 1] = str(path)
    return argv


def train_main(method: str, trainer_cls=None, config_cls=None, argv: list[str] | None = None,
               prog: str | None = None):
    """``trl-variants train <method> [--config NAME_OR_PATH] [flags]`` and ``examples/train_<method>.py``: train with
    :func:`run_training`; without ``--config`` on the method's default recipe (:func:`default_recipe`), with
    ``--config`` on a YAML file or a shipped recipe (:func:`resolve_recipe`, bare names looked up in ``method``'s
    folder first). ``trainer_cls`` / ``config_cls``: the method's own (:data:`METHODS`) unless given, e.g. your
    subclass of them."""
    if trainer_cls is None or config_cls is None:
        own_trainer, own_config = method_classes(method)
        trainer_cls, config_cls = trainer_cls or own_trainer, config_cls or own_config
    argv = _with_resolved_config(sys.argv[1:] if argv is None else argv, method)
    return run_training(trainer_cls, config_cls, default_recipe(method), argv=argv, prog=prog)
