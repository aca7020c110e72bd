"""Model cards: every trainer's card names its paper (arXiv link when there is one), carries the method's and GRPO's
citations (and those of the parts it runs), and names a local base model by its directory's last part (TRL 1.16
renders "[None]" for a local directory)."""

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
    assert "fine-tuned version of the tiny default model shipped with trl-variants (`tiny`)" in card
    assert str(DEFAULT_MODEL_PATH) not in card  # a local path names a user and a machine
    assert 'model="tiny-' + method + '"' in card and 'model="None"' not in card  # the quick start's id
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


def test_a_composed_card_cites_and_tags_the_methods_its_parts_come_from_and_names_them(tmp_path):
    """It cited ERPO, DPH-RL and EEPO whatever its parts, never DAPO, and had no method tag."""
    from trl_variants import ComposedConfig, ComposedTrainer, accuracy_reward

    from .helpers import DEFAULT_MODEL_PATH as PATH
    from .helpers import small_config

    out = tmp_path / "out"
    trainer = ComposedTrainer(model=PATH, reward_funcs=accuracy_reward, train_dataset=train_dataset(8),
                              args=small_config(ComposedConfig, out, parts=["erpo_query_kl", "dapo_dynamic_sampling"],
                                                max_completion_length=8))
    trainer.create_model_card(model_name="tiny-composed", dataset_name=str(tmp_path))  # a local dataset
    card = (out / "README.md").read_text()
    assert "@misc{erpo2025," in card and "@article{yu2025dapo," in card and "@article{shao2024deepseekmath," in card
    assert "li2025choice" not in card and "chen2025eepo" not in card
    assert card.index("yu2025dapo") < card.index("shao2024deepseekmath")  # GRPO's stays last
    header = card.split("---")[1]
    assert "- erpo" in header and "- dapo" in header and "- trl-variants-composed" in header
    assert "datasets:" not in header and str(tmp_path) not in card  # a local directory is no Hub dataset
    assert "trained with ComposedTrainer: GRPO with the parts `erpo_query_kl`, `dapo_dynamic_sampling`" in card


def test_a_method_with_dynamic_sampling_cites_dapo(tmp_path):
    out = tmp_path / "out"
    trainer = small_trainer("eepo", out, dataset=train_dataset(8), max_completion_length=8, dynamic_sampling=True)
    trainer.create_model_card(model_name="m")
    card = (out / "README.md").read_text()
    assert "@article{chen2025eepo," in card and "@article{yu2025dapo," in card and "- dapo" in card.split("---")[1]
    assert "Xiao Bi and Haowei Zhang" in card  # GRPO's author list as the papers give it


def test_public_names(tmp_path):
    from trl_variants._card import public_name

    assert public_name("Qwen/Qwen2.5-Math-7B") == "Qwen/Qwen2.5-Math-7B"
    assert public_name(f"{tmp_path}/runs/qwen-dph/") == "qwen-dph"
    assert public_name("./out/model") == "model"
    assert public_name(str(DEFAULT_MODEL_PATH)) == "tiny"
    assert public_name(None) is None


def test_the_training_command_names_recipes_hides_tokens_and_shortens_local_paths(tmp_path):
    from trl_variants._card import command_text
    from trl_variants.recipe_catalog import resolve_recipe

    recipe = str(resolve_recipe("erpo/tiny_cpu"))  # as train_main resolves --config: an absolute path
    local = tmp_path / "runs" / "erpo-1"
    command = command_text("trl-variants train erpo", ["--config", recipe, "--hub_token", "hf_secret",
                                                       f"--output_dir={local}", "--api_token=abc", "--max_steps", "3"])
    assert command == ("trl-variants train erpo --config erpo/tiny_cpu --hub_token '***' --output_dir=erpo-1 "
                       "'--api_token=***' --max_steps 3")


def test_a_card_made_from_the_command_line_shows_its_command(tmp_path):
    out = tmp_path / "out"
    trainer = small_trainer("erpo", out, dataset=train_dataset(8), max_completion_length=8)
    trainer.training_command = "trl-variants train erpo --max_steps 3"
    trainer.create_model_card(model_name="m")
    card = (out / "README.md").read_text()
    assert "## Training command" in card and "```bash\ntrl-variants train erpo --max_steps 3\n```" in card
