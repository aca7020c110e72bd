"""Model-card fixes shared by the four trainers, on top of TRL's ``create_model_card``.

TRL 1.16 (``BaseTrainer.create_model_card``) drops the base model when ``config._name_or_path`` is a local
directory (it only links Hub ids), and its template then renders "fine-tuned version of [None](...)". Its paper
sentence also needs an arXiv id, so a method without one (ERPO, an anonymous preprint) is never named. This mixin
lets TRL write the card, then rewrites those two sentences in the README it saved. The card's metadata is left
as TRL wrote it: the Hub only accepts repo ids as ``base_model``, so a local path goes in the text only.
"""

from __future__ import annotations

import os

_NONE_BASE = "[None](https://huggingface.co/None)"


def public_name(name_or_path: str | None) -> str | None:
    """How a card or a published record names a model or a dataset: a Hub id as it is; a local directory by its last
    part (its full path, e.g. under a user's home or scratch directory, names a user and a machine, and means nothing
    on the Hub); the tiny default shipped with the package as ``tiny``."""
    if not name_or_path:
        return name_or_path
    from .default import DEFAULT_MODEL_PATH

    text = str(name_or_path)
    if os.path.normpath(text) == os.path.normpath(str(DEFAULT_MODEL_PATH)):
        return "tiny"
    if os.path.isabs(text) or text.startswith(("./", "../", "~")) or os.path.isdir(text):
        return os.path.basename(os.path.normpath(os.path.expanduser(text)))
    return text


def base_model_text(name_or_path: str | None) -> str:
    """How the card names a base model TRL could not link."""
    if not name_or_path:
        return "a model whose config records no name or path"
    if public_name(name_or_path) == "tiny":
        return "the tiny default model shipped with trl-variants (`tiny`)"
    return f"the local model `{public_name(name_or_path)}`"


def fix_model_card(text: str, name_or_path: str | None, trainer_name: str, paper: dict, parts=(),
                   model_id: str | None = None) -> str:
    """``text`` (a card TRL rendered) with the local base model named, the paper named when it has no id, the parts
    a trainer without a paper of its own ran named, and the quick start's model id (TRL writes "None" without a Hub
    id) set to ``model_id``."""
    text = text.replace(_NONE_BASE, base_model_text(name_or_path))
    if not paper.get("id") and paper.get("title"):
        text = text.replace(f"This model was trained with {trainer_name}.",
                            f"This model was trained with {trainer_name}, a method introduced in "
                            f"*{paper['title']}* (preprint without an arXiv id; cited below).")
    elif not paper.get("title") and parts:
        text = text.replace(f"This model was trained with {trainer_name}.",
                            f"This model was trained with {trainer_name}: GRPO with the parts "
                            f"{', '.join(f'`{p}`' for p in parts)} (their papers are cited below).")
    if model_id:
        text = text.replace('model="None"', f'model="{model_id}"')
    return text


def with_part_citations(paper: dict, parts) -> dict:
    """``paper`` with the citation of every part's paper it does not hold yet (e.g. DAPO's for dynamic sampling),
    before GRPO's, which stays last."""
    from ._citations import GRPO

    citation = paper.get("citation") or ""
    extra = []
    for part in parts:
        entry = getattr(part, "citation", None)
        if entry and entry not in citation and entry not in extra:
            extra.append(entry)
    if not extra:
        return paper
    if GRPO in citation:
        citation = citation.replace(GRPO, "\n\n".join([*extra, GRPO]))
    else:
        citation = "\n\n".join([c for c in (citation, *extra) if c])
    return {**paper, "citation": citation}


def command_text(prog: str | None, argv: list[str]) -> str:
    """The command line of a run as a card shows it: a shipped recipe by its name, a local path by its last part
    (:func:`public_name`), the value of any ``--*token*`` flag hidden."""
    import shlex
    import sys
    from pathlib import Path

    from .recipe_catalog import RECIPES_DIR, recipe_name

    def shown(value: str) -> str:
        path = Path(value).expanduser()
        if path.suffix in (".yaml", ".yml") and path.is_file() and path.resolve().is_relative_to(RECIPES_DIR.resolve()):
            return recipe_name(path)
        return public_name(value) if os.path.isabs(value) else value

    words, hide = [], False  # hide: this argument is the value of the token flag before it
    for arg in argv:
        name, eq, value = arg.partition("=")
        secret = not hide and arg.startswith("--") and "token" in name
        if hide:
            words.append("***")
        elif secret:
            words.append(f"{name}=***" if eq else arg)
        else:
            words.append(f"{name}={shown(value)}" if arg.startswith("--") and eq else shown(arg))
        hide = secret and not eq
    script = os.path.relpath(sys.argv[0]) if sys.argv[0] else "train.py"
    head = shlex.split(prog) if prog else ["python", os.path.basename(script) if script.startswith("..") else script]
    return shlex.join(head + words)


def command_section(command: str) -> str:
    from importlib import metadata

    try:
        version = metadata.version("trl-variants")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return (f"\n## Training command\n\nThe command that trained this model, with trl-variants {version} (its shipped "
            "recipes, named by `--config`, are part of the package):\n\n```bash\n" + command + "\n```\n")


class ModelCardMixin:
    """Put before ``GRPOTrainer`` in a trainer's bases; uses the class's ``_name`` and ``_paper``, and the tags and
    citations of its parts (``Part.citation``, ``Part.tag``)."""

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        parts = list(getattr(self, "parts", []) or [])
        tags = [tags] if isinstance(tags, str) else list(tags or [])
        tags += [p.tag for p in parts if getattr(p, "tag", None) and p.tag not in tags]
        if dataset_name and os.path.exists(str(dataset_name)):  # a local dataset is no Hub id: no link, no metadata
            dataset_name = None
        had_own = "_paper" in vars(self)
        own = self._paper
        self._paper = with_part_citations(own, parts)
        try:
            super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        finally:
            if had_own:
                self._paper = own
            else:
                del self._paper
        if not self.is_world_process_zero():
            return
        path = os.path.join(self.args.output_dir, "README.md")
        if not os.path.isfile(path):
            return
        from trl.trainer.utils import get_config_model_id

        with open(path, encoding="utf-8") as f:
            text = f.read()
        model_id = self.args.hub_model_id or model_name or os.path.basename(os.path.normpath(self.args.output_dir))
        fixed = fix_model_card(text, get_config_model_id(self.model.config), self._name, self._paper,
                               parts=[str(p) for p in parts], model_id=model_id)
        command = getattr(self, "training_command", None)  # set by the command line (training.run)
        if command and "## Training command" not in fixed:
            fixed = fixed.rstrip("\n") + "\n" + command_section(command)
        if fixed != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(fixed)
