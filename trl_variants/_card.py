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


def base_model_text(name_or_path: str | None) -> str:
    """How the card names a base model TRL could not link."""
    if not name_or_path:
        return "a model whose config records no name or path"
    return f"the local model `{name_or_path}`"


def fix_model_card(text: str, name_or_path: str | None, trainer_name: str, paper: dict) -> str:
    """``text`` (a card TRL rendered) with the local base model named and the paper named when it has no id."""
    text = text.replace(_NONE_BASE, base_model_text(name_or_path))
    if not paper.get("id") and paper.get("title"):
        text = text.replace(f"This model was trained with {trainer_name}.",
                            f"This model was trained with {trainer_name}, a method introduced in "
                            f"*{paper['title']}* (preprint without an arXiv id; cited below).")
    return text


class ModelCardMixin:
    """Put before ``GRPOTrainer`` in a trainer's bases; uses the class's ``_name`` and ``_paper``."""

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if not self.is_world_process_zero():
            return
        path = os.path.join(self.args.output_dir, "README.md")
        if not os.path.isfile(path):
            return
        from trl.trainer.utils import get_config_model_id

        with open(path, encoding="utf-8") as f:
            text = f.read()
        fixed = fix_model_card(text, get_config_model_id(self.model.config), self._name, self._paper)
        if fixed != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(fixed)
