"""The shipped recipes (``trl_variants/recipes/``, a clone's ``configs/``): lookup by name (:func:`resolve_recipe`,
what ``--config NAME`` accepts) and the listing ``trl-variants recipes`` prints (:func:`recipes_text`)."""

from __future__ import annotations

import re
from pathlib import Path

from .registry import REGISTRY

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
"""The shipped YAMLs (package data): ``<method>/<name>.yaml`` training recipes and ``accelerate/<name>.yaml``
launch configs. A clone's ``configs/`` is a link to this folder."""

METHODS = {name: (m.module, m.trainer, m.config) for name, m in REGISTRY.items()}
"""``trl-variants train <method>``: the module, trainer class and config class of each method
(:data:`trl_variants.registry.REGISTRY`); each has a ``<method>/`` folder of recipes."""

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
    if value.startswith("-") and not path.is_file():  # `--config --output_dir out`: the value is missing
        raise ValueError(f"needs a value (a shipped recipe's name or a YAML file), got the flag {value}: write "
                         f"`--config <recipe or file> {value} ...`")  # the callers say "--config" first
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


_HEADER_PROCESSES = re.compile(r"^#\s*processes:\s*(\d+)")


def _describe(path) -> tuple[str, str]:
    """``(processes, first header line)`` of a shipped YAML, for the listing."""
    lines = path.read_text().splitlines()
    first = lines[0].lstrip("#").strip() if lines and lines[0].startswith("#") else ""
    processes = next((m.group(1) for m in map(_HEADER_PROCESSES.match, lines) if m), "")
    return processes, first


def recipes_text(width: int = 118) -> str:
    """What ``trl-variants recipes`` / ``trl-variants train --list`` print: every shipped YAML by name."""
    name_width = max(len(recipe_name(p)) for p in shipped_recipes())

    def row(path, note: str | None) -> str:
        text = f"  {recipe_name(path):<{name_width}}  {'' if note is None else f'{note:<12} '}{_describe(path)[1]}"
        return text if len(text) <= width else text[:width - 3] + "..."

    lines = [f"Recipes shipped with trl-variants, in {RECIPES_DIR} (a clone's configs/).", "",
             "Training recipes: trl-variants train METHOD --config NAME   (NAME, NAME.yaml or METHOD/NAME; without "
             f"--config: METHOD/{DEFAULT_RECIPE})"]
    for method in METHODS:
        for path in shipped_recipes(method):
            processes = _describe(path)[0]
            note = "default" if path.stem == DEFAULT_RECIPE else f"{processes} processes" if processes else ""
            lines.append(row(path, note))
    lines += ["", "Accelerate configs: accelerate launch --config_file $(trl-variants recipes --path accelerate/NAME) "
              "-m trl_variants train ..."]
    lines += [row(path, None) for path in shipped_recipes("accelerate")]
    lines += ["", "A recipe's header gives its launch command from a clone (examples/train_METHOD.py --config "
              "configs/METHOD/NAME.yaml); installed, the same run is", "  accelerate launch --config_file "
              "$(trl-variants recipes --path accelerate/zero2) $(which trl-variants) train erpo --config "
              "erpo/qwen2.5-math-7b",
              "`trl-variants recipes --path NAME` prints a recipe's file (copy it to change it; --config takes a "
              "path too)."]
    return "\n".join(lines)


# the Hub id the shipped recipes hold in place of the user's: every push to it is refused before anything loads
_PLACEHOLDER_HUB_ID = re.compile(r"^(your[-_]?[a-z]*|<[^>]*>|org|user|username)/", re.IGNORECASE)


def is_placeholder_hub_id(hub_id: str | None) -> bool:
    """A ``hub_model_id`` a shipped recipe holds in place of the user's (``your-org/...``, ``<you>/...``)."""
    return bool(hub_id) and _PLACEHOLDER_HUB_ID.match(hub_id) is not None


def hub_push_problems(repo_id: str | None, field: str) -> list[str]:
    """What stops a push to the Hub repository ``repo_id`` (the option ``field``), each with its fix: a placeholder
    id, no token, ``HF_HUB_OFFLINE``. Checked before any work (the push comes after the training or the pass)."""
    from huggingface_hub import constants, get_token

    problems = []
    if is_placeholder_hub_id(repo_id):
        problems.append(f"push_to_hub: true with the placeholder {field} {repo_id!r}: pass --{field} "
                        f"<you>/{repo_id.split('/', 1)[1]} (a repository you may write to), or --push_to_hub false")
    if get_token() is None:
        problems.append("push_to_hub: true needs a Hub token with write access: run `hf auth login` (or set "
                        "HF_TOKEN), or pass --push_to_hub false")
    if constants.HF_HUB_OFFLINE:
        problems.append("push_to_hub: true, but HF_HUB_OFFLINE is set (no network to the Hub): unset it, or pass "
                        "--push_to_hub false")
    return problems
