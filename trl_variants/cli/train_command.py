"""``trl-variants train <method>`` (the example scripts, inside the package:
:func:`trl_variants.training.train_main`) and ``trl-variants recipes`` (the shipped recipes:
:mod:`trl_variants.recipe_catalog`)."""

from __future__ import annotations

import argparse
import sys

from ..recipe_catalog import DEFAULT_RECIPE, METHODS, recipes_text, resolve_recipe
from .help import COMMAND_HELP


def recipes_main(argv: list[str]) -> None:
    """``trl-variants recipes [--path NAME]``: the listing of the shipped recipes, or one recipe's file."""
    parser = argparse.ArgumentParser(prog="trl-variants recipes", description=COMMAND_HELP["recipes"])
    parser.add_argument("--path", metavar="NAME", default=None,
                        help="Print the file of the shipped recipe or accelerate config NAME (e.g. "
                             "erpo/qwen2.5-math-7b, accelerate/zero2) instead of the list.")
    args = parser.parse_args(argv)
    if args.path is None:
        print(recipes_text())
        return
    try:
        print(resolve_recipe(args.path, files=False))
    except (FileNotFoundError, ValueError) as e:
        print(f"trl-variants recipes: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def train_usage() -> str:
    """``trl-variants train --help``: the methods, ``--config``, ``--list`` and what train checks first."""
    return "\n".join([
        "usage: trl-variants train {" + ",".join(METHODS) + "} [--config RECIPE] [--option value ...]",
        "       trl-variants train --list",
        "", COMMAND_HELP["train"], "",
        "methods: erpo (ERPOTrainer), eepo (EEPOTrainer), dph (DPHTrainer), apo (APOTrainer), composed "
        "(ComposedTrainer: the parts you list), grpo (TRL's GRPOTrainer, the baseline)",
        f"--config RECIPE: a YAML file, or a shipped recipe by name (erpo/qwen2.5-math-7b, or qwen2.5-math-7b.yaml); "
        f"default: METHOD/{DEFAULT_RECIPE}, the embedded task on a CPU, offline. Flags override the YAML.",
        "--list: list the shipped recipes (also `trl-variants recipes`).",
        "",
        "Before any data or model loads, train checks what the run needs (the vllm / deepspeed / tracker extras, the "
        "wandb login, a Hub id and token for --push_to_hub) and lists what is missing; a recipe launched on another "
        "process count than its header's keeps its global batch (--keep_recipe_batch false: the per-device values as "
        "written). --resume_from_checkpoint true resumes the last checkpoint of --output_dir.",
        "",
        "Run `trl-variants train METHOD --help` for every option of a method. Several processes, as for TRL's "
        "`accelerate launch $(which trl) grpo`:",
        "  accelerate launch -m trl_variants train erpo [--config RECIPE] [--option value ...]",
        "  accelerate launch $(which trl-variants) train erpo [--config RECIPE] [--option value ...]",
    ])


def train_cli(argv: list[str]) -> None:
    """``trl-variants train <method> [--config RECIPE] [flags]`` (or ``--list``, ``--help``)."""
    from ..training.run import train_main

    if not argv or argv[0] in ("-h", "--help"):
        print(train_usage(), file=sys.stdout if argv else sys.stderr)
        raise SystemExit(0 if argv else 2)
    if argv[0] in ("--list", "-l"):
        print(recipes_text())
        return
    if argv[0] not in METHODS:
        problem = (f"expected a method before the options, got {argv[0]!r}" if argv[0].startswith("-")
                   else f"unknown method {argv[0]!r}")
        print(f"{train_usage()}\n\ntrl-variants train: error: {problem}; choose one of: {', '.join(METHODS)}",
              file=sys.stderr)
        raise SystemExit(2)
    train_main(argv[0], argv=argv[1:], prog=f"trl-variants train {argv[0]}")

