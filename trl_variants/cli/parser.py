"""How every ``trl-variants`` command parses its options: TRL's ``TrlParser`` with one-line refusals."""

from __future__ import annotations

from trl import TrlParser


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

    def parse_args_and_config(self, args=None, *more, **kwargs):
        """TrlParser's, with a ``--config`` file that is not valid YAML refused in one line naming the file."""
        import yaml

        try:
            return super().parse_args_and_config(args, *more, **kwargs)
        except yaml.YAMLError as e:
            argv = list(args) if args is not None else []
            path = argv[argv.index("--config") + 1] if "--config" in argv[:-1] else "the YAML file"
            raise ValueError(f"--config {path}: not valid YAML ({' '.join(str(e).split())}): fix the file (a "
                             "mapping, one `option: value` per line)") from None

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


def parse_with_recipe(parser: Parser, argv: list[str], command: str, to_options) -> tuple:
    """``parser``'s dataclasses from ``argv``, where ``--config`` may name a training recipe (a path or a shipped
    recipe's name, :func:`~trl_variants.recipe_catalog.resolve_recipe`): ``to_options(recipe, path, value, rest)`` turns
    its keys into this command's options (``rest``: the other flags, which override them). A YAML that is not a
    mapping goes to the parser as it is. ``command`` names the command in the errors."""
    import os
    import tempfile

    import yaml

    from ..recipe_catalog import resolve_recipe
    from .errors import UsageError

    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            argv[i:i + 1] = ["--config", arg.split("=", 1)[1]]
            break
    if "--config" not in argv:
        return parser.parse_args_and_config(args=argv)
    i = argv.index("--config")
    if i + 1 >= len(argv):
        raise ValueError(f"--config needs a value: a YAML of {command}'s options, a training recipe's path or a shipped recipe's "
                         "name (`trl-variants recipes`)")
    value = argv[i + 1]
    try:
        path = resolve_recipe(value)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(f"--config {e}") from None
    try:
        recipe = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"--config {value}: not valid YAML ({' '.join(str(e).split())}): fix the file (a mapping, "
                         "one `option: value` per line)") from None
    rest = argv[:i] + argv[i + 2:]
    if not isinstance(recipe, dict):
        return parser.parse_args_and_config(args=["--config", str(path), *rest])
    options = to_options(recipe, path, value, rest)
    with tempfile.TemporaryDirectory() as tmp:
        mapped = os.path.join(tmp, f"{command}.yaml")
        with open(mapped, "w") as f:
            yaml.safe_dump(options, f)
        return parser.parse_args_and_config(args=["--config", mapped, *rest])
