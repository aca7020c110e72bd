"""``trl-variants`` command line (also ``python -m trl_variants``): ``trl-variants train <method> [--config recipe]
[--flag value ...]``, ``trl-variants recipes``, ``trl-variants {presample,evaluate} --config file.yaml [--flag value
...]`` and ``trl-variants cache {list,clear}``.

``train``, ``presample`` and ``evaluate`` parse their arguments with TRL's ``TrlParser`` (YAML via ``--config``,
command-line flags override it; :class:`~trl_variants.cli.parser.Parser`). ``train`` is what
``examples/train_<method>.py`` runs, from inside the package, with the recipes shipped in it: ``accelerate launch -m
trl_variants train erpo ...`` or ``accelerate launch $(which trl-variants) train erpo ...``, as TRL documents
``accelerate launch $(which trl) grpo``.

Modules: ``parser`` (how every command parses), ``errors`` (one-line errors), ``help`` (the help texts), and one
module per command: ``train_command`` (``train``, ``recipes``), ``presample_command``, ``evaluate_command``,
``cache_command``. Only ``errors`` and ``help`` are imported here, and a command's module when it runs: ``trl-variants
--help`` imports neither torch nor TRL's trainers, and ``parser`` / ``errors`` stay leaves that
:mod:`trl_variants.training` can import without a circle.
"""

from __future__ import annotations

import importlib
import sys

from .errors import TRACEBACK_ENV, USER_ERRORS, run_command, traceback_wanted, training_started
from .help import COMMAND_HELP, usage

COMMANDS = {"train": "train_command.train_cli", "recipes": "train_command.recipes_main",
            "presample": "presample_command.presample_main", "evaluate": "evaluate_command.evaluate_main",
            "cache": "cache_command.cache_main"}
"""``trl-variants <command>``: the ``module.function`` (in this package) that runs it, imported when it runs (in
:data:`~trl_variants.cli.help.COMMAND_HELP`'s order)."""

__all__ = ["COMMANDS", "COMMAND_HELP", "TRACEBACK_ENV", "USER_ERRORS", "command", "main", "training_started", "usage"]


def command(name: str):
    """The function of the command ``name`` (:data:`COMMANDS`), importing its module."""
    module, function = COMMANDS[name].split(".")
    return getattr(importlib.import_module(f".{module}", __name__), function)


def main(argv: list[str] | None = None) -> None:
    """The ``trl-variants`` command. Run as the command (``argv`` None: ``sys.argv``), a user error before training
    starts (:data:`~trl_variants.cli.errors.USER_ERRORS`) prints one line and exits with code 2; ``main(argv)``
    called from Python raises it, as ``--traceback`` does."""
    command_line = argv is None
    argv, show_traceback = traceback_wanted(list(sys.argv[1:] if argv is None else argv))
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        raise SystemExit(0)
    if not argv or argv[0] not in COMMANDS:
        problem = ("no command given" if not argv else
                   f"expected a command before the options, got {argv[0]!r}" if argv[0].startswith("-") else
                   f"unknown command {argv[0]!r}")
        print(f"{usage()}\n\ntrl-variants: error: {problem}; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        raise SystemExit(2)
    run_command(command(argv[0]), argv[1:], one_line=command_line and not show_traceback)
