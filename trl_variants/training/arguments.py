"""Argument parsing of a training run (``trl-variants train <method>``, ``examples/train_<method>.py``): the options
(:class:`TrainScriptArguments`, the method's config, ``ModelConfig``), the parser whose help starts with the method's
own options and shows the recipe's values, and the held-out evaluation flags.

Arguments are parsed the TRL way: ``TrlParser`` over (script arguments, the trainer's config, ``ModelConfig``), a
``--config file.yaml`` supplying values and command-line flags overriding them.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trl import ModelConfig

from ..cli.parser import Parser
from ..data import DataScriptArguments, uses_embedded
from ..recipe_catalog import RECIPES_DIR, recipe_name


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
    :func:`~trl_variants.training.run_training` (:func:`check_heldout_flags`, naming where it was set)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    origin = heldout_origin(argv, default_config)
    if default_config is not None and "--config" not in argv:
        argv = ["--config", str(default_config), *argv]
    parser = method_parser(config_cls, prog=prog, recipe=config_argument(argv, None))
    script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    if origin.startswith("default config "):
        check_heldout_flags(script_args, origin)
    if script_args.torch_threads:
        import torch

        torch.set_num_threads(script_args.torch_threads)
    return script_args, training_args, model_args


def config_argument(argv: list[str], default_config: str | Path | None) -> str | None:
    """The YAML of the command line: ``--config FILE`` / ``--config=FILE``, else ``default_config``."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None if default_config is None else str(default_config)


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


def training_keys() -> set[str]:
    """Every option a training recipe may hold: the script arguments, ModelConfig and each method's config."""
    from dataclasses import fields

    from trl import ModelConfig

    from ..registry import REGISTRY, method_classes

    classes = [TrainScriptArguments, ModelConfig] + [method_classes(m)[1] for m in REGISTRY]
    return {f.name for cls in classes for f in fields(cls)}
