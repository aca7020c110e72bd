"""Model cards: every trainer's card names its paper (arXiv link when there is one), carries the method's and GRPO's
citations, and names a local base model by its path (TRL 1.16 renders "[None]" for a local directory)."""

from __future__ import annotations

import pytest

from trl_variants import DEFAULT_MODEL_PATH
from trl_variants._card import fix_model_card

from .helpers import small_trainer, train_dataset

# arXiv id (None: no arXiv id), a distinctive piece of the method's citation
CASES = {
    "erpo": (None, "@misc{erpo2025,"),
    "eepo": ("2510.05837", "Hinrich Sch{\\\"u}tze and Kam-Fai Wong"),
    "dph": ("2509.07430", "@article{li2025choice,"),
    "apo": ("2505.20686", "@article{brantley2025accelerating,"),
}


@pytest.mark.parametrize("method", list(CASES))
def test_card_links_paper_and_names_local_base_model(tmp_path, method):
    arxiv_id, citation = CASES[method]
    out = tmp_path / "out"
    trainer = small_trainer(method, out, dataset=train_dataset(8), max_completion_length=8)
    trainer.create_model_card(model_name="tiny-" + method)
    card = (out / "README.md").read_text()
    title = trainer._paper["title"]
    assert "[None]" not in card and "huggingface.co/None" not in card
    assert f"fine-tuned version of the local model `{DEFAULT_MODEL_PATH}`" in card
    assert f"This model was trained with {trainer._name}, a method introduced in" in card
    assert title in card
    if arxiv_id:
        assert f"[{title}](https://huggingface.co/papers/{arxiv_id})" in card
        assert f"arXiv:{arxiv_id}" in card  # in the method's BibTeX entry
    else:
        assert "preprint without an arXiv id" in card
    assert citation in card
    assert "@article{shao2024deepseekmath," in card  # GRPO, which every method extends


def test_fix_model_card_hub_id_untouched_and_missing_path():
    paper = {"title": "T", "id": "2501.00001"}
    hub = "fine-tuned version of [org/m](https://huggingface.co/org/m).\nThis model was trained with X, a method"
    assert fix_model_card(hub, "org/m", "X", paper) == hub
    unnamed = fix_model_card("version of [None](https://huggingface.co/None).", None, "X", paper)
    assert unnamed == "version of a model whose config records no name or path."
