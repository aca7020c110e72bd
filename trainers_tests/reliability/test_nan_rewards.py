"""A reward function that returns NaN: every trainer treats it as GRPOTrainer does (TRL turns None into NaN; a NaN is
"no reward from this function for that completion", left out by its ``nansum`` / ``nanmean``), and says so once,
naming the function (a NaN is usually a bug in the function, e.g. 0 / 0, not a chosen "no reward")."""

from __future__ import annotations

import math
import warnings

import pytest

from trl_variants import ComposedConfig, ComposedTrainer, accuracy_reward

from ..helpers import DEFAULT_MODEL_PATH, TRAINERS, small_config, small_trainer, train_dataset

RULE_IDS = [*TRAINERS, "composed"]


def nan_reward(completions, **kwargs):
    """NaN for the first completion of every call, 1.0 for the others."""
    return [math.nan] + [1.0] * (len(completions) - 1)


def _trainer(method, tmp_path):
    kw = dict(max_steps=2, per_device_train_batch_size=4, max_completion_length=8)
    if method == "composed":  # ERPO's two parts and DPH-RL's rehearsal, the smallest offline pass
        return ComposedTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=[accuracy_reward, nan_reward],
                               args=small_config(ComposedConfig, tmp_path, num_generations=2, num_presamples=2,
                                                 pef_threshold=2, presample_cache_dir=str(tmp_path / "cache"), **kw),
                               train_dataset=train_dataset(16))
    if method != "apo":
        kw["num_generations"] = 2
    return small_trainer(method, tmp_path, dataset=train_dataset(16), reward_funcs=[accuracy_reward, nan_reward], **kw)


@pytest.mark.parametrize("method", RULE_IDS)
def test_nan_reward_is_no_reward_and_said_once(method, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _trainer(method, tmp_path)
        trainer.train()
    said = [str(w.message) for w in caught if "NaN" in str(w.message) and "nan_reward" in str(w.message)]
    assert len(said) == 1, said  # two steps (and the offline pass of DPH-RL / A*-PO) call it: said once
    assert "as GRPOTrainer" in said[0] and "None" in said[0]
    assert trainer.state.global_step == 2
    logged = [h for h in trainer.state.log_history if "rewards/nan_reward/mean" in h]
    assert logged and all(h["rewards/nan_reward/mean"] == 1.0 for h in logged)  # the NaN left out (TRL's nanmean)
    assert all(math.isfinite(h["loss"]) for h in trainer.state.log_history if "loss" in h)


def test_offline_pass_says_a_nan_reward_once(tmp_path, tiny_model, tiny_tokenizer):
    from trl_variants.presample import PresampleConfig, presample

    config = PresampleConfig(num_samples=2, max_completion_length=4, shard_size=2, cache_dir=str(tmp_path / "cache"),
                             show_progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = presample(tiny_model, tiny_tokenizer, train_dataset(4), [accuracy_reward, nan_reward], config)
    said = [str(w.message) for w in caught if "NaN" in str(w.message) and "nan_reward" in str(w.message)]
    assert len(said) == 1, said  # two shards, two calls
    per_func = [v for row in out["ref_rewards_per_func"] for v in row]
    assert sum(math.isnan(v[1]) for v in per_func) == 2 and all(not math.isnan(v[0]) for v in per_func)
