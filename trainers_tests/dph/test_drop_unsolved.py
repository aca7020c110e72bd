"""DPHTrainer with ``drop_unsolved``: the prompts no reference sample solves leave both sets (App. G.1)."""

from trl_variants import DPHConfig, DPHTrainer, accuracy_reward

from ..helpers import DEFAULT_MODEL_PATH, small_config, train_dataset


def test_trainer_drops_unsolved_prompts(tmp_path):
    n = 16
    dph = DPHTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward,
                     args=small_config(DPHConfig, tmp_path / "dph", num_presamples=2, pef_threshold=2,
                                       presample_cache_dir=str(tmp_path / "cache"), max_completion_length=24,
                                       drop_unsolved=True),
                     train_dataset=train_dataset(n))
    rewards = dph.part("dph_rehearsal")._presampled(dph, train_dataset(n))["ref_rewards"]  # the split's cached samples
    unsolved = sum(max(r) < 1.0 for r in rewards)
    near_perfect = sum(min(r) >= 1.0 for r in rewards)
    assert 0 < unsolved < n, "the tiny model should solve some prompts and fail some: the test needs both"
    stats = dph.split_stats
    assert (stats["num_unsolved_dropped"], stats["num_pef_prompts"]) == (unsolved, near_perfect)
    assert len(dph.train_dataset) == stats["num_exp_prompts"] == n - unsolved - near_perfect
