"""The presampled dataset's card (source dataset, split, model, reward functions, options) and the Hub push order
(mocked: no network)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from datasets import Dataset
from huggingface_hub import DatasetCard, HfApi

from trl_variants.cli.presample_command import presample_source, push_presampled
from trl_variants.presample import PresampleConfig, dataset_card
from trl_variants.presample.card import CARD_MARKER
from trl_variants.presample.metadata import presample_metadata, with_metadata


def _presampled(reward_funcs=("accuracy_reward", "format_reward")):
    ds = Dataset.from_dict({"prompt": ["a", "b"], "ref_rewards": [[1.0, 0.0], [0.0, 0.0]], "ref_value": [0.5, 0.0]})
    return with_metadata(ds, PresampleConfig(num_samples=2, value_beta=0.5), "key", list(reward_funcs))


def test_card_names_source_model_rewards_and_options():
    ds = _presampled()
    assert presample_metadata(ds)["reward_funcs"] == ["accuracy_reward", "format_reward"]
    card = dataset_card(ds, "org/ref-model", "org/presampled",
                        source={"dataset": "org/math", "config": "algebra", "split": "train"})
    assert CARD_MARKER in card
    for text in ("- source dataset: `org/math`", "- dataset config: `algebra`", "- split: `train`",
                 "- reference model: `org/ref-model`", "`accuracy_reward`, `format_reward`",
                 "| `num_samples` | `2` |", "| `value_beta` | `0.5` |", "`ref_value`", "2505.20686"):
        assert text in card, text


def test_card_names_the_trainers_that_can_read_it_and_cites_only_theirs():
    """Every card said it was stage 1 of A*-PO, DPH-RL and ERPO, for any of their trainers: a DPH-RL recipe's pass
    (no ref_value, no prompt log-likelihood) cannot feed APOTrainer or ERPOTrainer."""
    apo = dataset_card(_presampled(), "m")
    assert "Pass it to `APOTrainer` as `train_dataset`" in apo and "brantley2025accelerating" in apo
    assert "li2025choice" not in apo and "erpo2025" not in apo
    both = Dataset.from_dict({"prompt": ["a"], "ref_prompt_logp": [-3.0], "ref_rewards": [[1.0]], "ref_value": [1.0],
                              "ref_completion_ids": [[[1, 2]]], "ref_completion_logps": [[[-0.1, -0.2]]],
                              "ref_prompt_ids": [[5, 6]]})
    every = dataset_card(with_metadata(both, PresampleConfig(num_samples=1, value_beta=0.5), "k", ["r"]), "m")
    assert "Pass it to `APOTrainer` or `DPHTrainer` or `ERPOTrainer`" in every
    assert all(key in every for key in ("brantley2025accelerating", "li2025choice", "erpo2025"))


def test_card_without_rewards_and_embedded_source():
    args = SimpleNamespace(dataset_name="embedded", split="test", embedded_train_size=6, embedded_test_size=4,
                           embedded_seed=0, dataset_config=None, dataset_train_split="train", filter_column=None)
    source = presample_source(args)
    assert source["split"] == "test" and source["dataset"].startswith("embedded")
    card = dataset_card(_presampled(reward_funcs=()), "tiny", source=source)
    assert "- split: `test`" in card and "- embedded_test_size: `4`" in card
    assert "reward functions: none" in card


@pytest.fixture
def hub(monkeypatch):
    """A fake Hub dataset repo: ``state["readme"]`` is its README.md (None: no repo); ``calls`` the upload order."""
    state = {"readme": None, "calls": []}

    def load(repo_id, repo_type=None, **kw):
        return DatasetCard(state["readme"])

    def push_data(self, repo_id, **kw):  # as `datasets` does: update the README's YAML, keep the rest
        state["calls"].append("data")
        card = DatasetCard(state["readme"] or "---\n---\n")
        card.data["dataset_info"] = {"splits": [{"name": "train"}]}
        card.data["configs"] = [{"config_name": "default"}]
        state["readme"] = str(card)

    def push_card(self, repo_id, **kw):
        state["calls"].append("card")
        state["readme"] = str(self)

    monkeypatch.setattr(HfApi, "repo_exists", lambda self, *a, **k: state["readme"] is not None)
    monkeypatch.setattr(HfApi, "file_exists", lambda self, *a, **k: state["readme"] is not None)
    monkeypatch.setattr(DatasetCard, "load", staticmethod(load))
    monkeypatch.setattr(Dataset, "push_to_hub", push_data)
    monkeypatch.setattr(DatasetCard, "push_to_hub", push_card)
    return state


def test_push_data_then_card_keeps_datasets_yaml(hub):
    ds = _presampled()
    card = dataset_card(ds, "m", "org/p", source={"dataset": "org/math", "split": "train"})
    push_presampled(ds, card, "org/p")
    assert hub["calls"] == ["data", "card"]
    final = DatasetCard(hub["readme"])
    assert CARD_MARKER in final.text and "- source dataset: `org/math`" in final.text
    assert final.data.to_dict()["configs"] == [{"config_name": "default"}] and "presample" in final.data.tags
    push_presampled(ds, card, "org/p")  # our own card is replaced without asking
    assert hub["calls"] == ["data", "card"] * 2


def test_push_refuses_to_replace_a_user_readme(hub):
    hub["readme"] = "---\nlicense: mit\n---\n\n# My dataset\n\nNotes I wrote.\n"
    ds = _presampled()
    card = dataset_card(ds, "m", "org/p")
    with pytest.raises(ValueError, match="hub_overwrite_card"):
        push_presampled(ds, card, "org/p")
    assert hub["calls"] == []  # nothing uploaded
    push_presampled(ds, card, "org/p", overwrite_card=True)
    assert hub["calls"] == ["data", "card"] and CARD_MARKER in hub["readme"]
    assert "license: mit" in hub["readme"]  # the YAML metadata carries over, the body is ours


def test_presample_cli_card_names_source_and_rewards(tmp_path):
    from trl_variants.cli.presample_command import presample_main

    out = tmp_path / "out"
    presample_main(["--num_samples", "1", "--max_completion_length", "4", "--embedded_train_size", "2",
                    "--output_dir", str(out), "--cache_dir", str(tmp_path / "c")])
    card = (out / "README.md").read_text()
    for text in ("- source dataset: `embedded", "- split: `train`", "- embedded_train_size: `2`",
                 "- reference model: `tiny`", "- reward functions: `accuracy_reward`",
                 "| `num_samples` | `1` |"):
        assert text in card, text


def test_correct_means_reward_at_least_the_threshold_not_above_zero():
    """One rule for "correct" in the pass's statistics: reward >= threshold (1.0: a right answer under a binary
    reward), never reward > 0; a sample without a reward (NaN) is left out, as TRL leaves it out."""
    from datasets import Dataset

    from trl_variants.presample.metadata import summarize

    shaped = Dataset.from_dict({"ref_rewards": [[0.2, 0.5], [1.0, 1.2], [float("nan"), 1.0], [0.0, 0.0]]})
    stats = summarize(shaped)
    assert stats["frac_all_correct"] == 0.5  # [1.0, 1.2] and [-, 1.0]; not [0.2, 0.5] (partial rewards)
    assert stats["frac_all_wrong"] == 0.5  # [0.2, 0.5] and [0.0, 0.0]
    assert summarize(shaped, threshold=0.2)["frac_all_correct"] == 0.75
