"""A*-PO's lazy stage 1 (``APOConfig.lazy_value_pass``): only the shards the run reaches, in sampler order, ahead of
need, with exactly the full pass's values; cached and resumable; refused where it is not safe. (2 processes == 1:
``trainers_tests/distributed/test_equivalence.py``, case ``apo_lazy``.)"""

import math

import pytest
import torch
from datasets import IterableDataset

from trl_variants import APOConfig, APOTrainer, accuracy_reward, losses
from trl_variants.apo.trainer import LAZY_ROW
from trl_variants.presample import PresampleConfig, presample
from trl_variants.presample import runner as ps

from ..helpers import DEFAULT_MODEL_PATH, small_config, train_dataset

ROWS, SHARD = 32, 4


def _apo(tmp_path, cache, lazy, dataset=None, peft_config=None, **kw):
    kw = dict(dict(num_value_samples=4, presample_cache_dir=str(cache), num_generations=1,
                   per_device_train_batch_size=4, presample_shard_size=SHARD, lazy_value_chunk_size=4,
                   lazy_value_pass=lazy), **kw)
    return APOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward,
                      args=small_config(APOConfig, tmp_path / ("lazy" if lazy else "full"), **kw),
                      train_dataset=dataset if dataset is not None else train_dataset(ROWS), peft_config=peft_config)


def _count_shards(monkeypatch):
    calls = []
    process = ps.sample_shard

    def counted(rows, prompt_ids, row_indices, shard_index, *a, **k):
        calls.append(shard_index)
        return process(rows, prompt_ids, row_indices, shard_index, *a, **k)

    monkeypatch.setattr(ps, "sample_shard", counted)
    return calls


def _watch_reached(trainer) -> list:
    """The dataset rows (their index column) the trainer asks values for, in order, as it trains."""
    reached = []
    values_of = trainer._lazy_values

    def watched(inputs):
        reached.extend(x[LAZY_ROW] for x in inputs)
        return values_of(inputs)

    trainer._lazy_values = watched
    return reached

def test_lazy_values_equal_full_pass_exactly(tmp_path, monkeypatch):
    """Two training runs, one with the full pass (in __init__), one lazy (separate caches: both really sample). On
    every prompt the lazy run valued, V_hat and the N rewards are exactly the full pass's (==, not approx), also for
    the chunks computed after the first update (sampled from the frozen reference); the lazy run valued fewer prompts
    than the dataset has, and trained exactly as the full-pass run (the pass does not touch training's RNG)."""
    full = _apo(tmp_path, tmp_path / "cache_full", lazy=False)
    assert len(full.train_dataset) == ROWS and "ref_value" in full.train_dataset.column_names
    full.train()  # each run trains right after its trainer's __init__, which seeds: both start from the same RNG state
    calls = _count_shards(monkeypatch)
    lazy = _apo(tmp_path, tmp_path / "cache_lazy", lazy=True)
    assert calls == [] and "ref_value" not in lazy.train_dataset.column_names  # nothing sampled at construction
    reached = _watch_reached(lazy)
    lazy.train()
    state = lazy._lazy
    assert set(reached) == set(state.order)  # the predicted sampler order is the order the run asked for
    assert set(reached) <= set(state.values) and 0 < len(state.values) < ROWS
    assert sorted(calls) == sorted(state.done)  # exactly the shards it planned, each once
    assert len(state.steps) >= 2 and state.steps[0] == 0 and max(state.steps) > 0  # a chunk after an update
    for r, value in state.values.items():
        assert value == full.train_dataset[r]["ref_value"], r
        assert state.rewards[r] == full.train_dataset[r]["ref_rewards"], r
    for key in ("loss", "apo/value_mean", "apo/regression_loss", "reward"):
        got = [h[key] for h in lazy.state.log_history if key in h]
        assert got and got == [h[key] for h in full.state.log_history if key in h], key
    # the logged metrics can agree by chance from another RNG state (the first version of this test built both
    # trainers before training either, and passed on torch 2.13 that way); the trained weights do not
    assert all(torch.equal(a, b) for a, b in zip(full.model.parameters(), lazy.model.parameters(), strict=True))
    logged = {k: v for h in lazy.state.log_history for k, v in h.items() if k.startswith("offline_pass/lazy")}
    assert logged["offline_pass/lazy_prompts"] == len(state.values)
    assert logged["offline_pass/lazy_chunks"] == len(state.steps)
    assert logged["offline_pass/lazy_fraction"] == len(state.values) / ROWS


def test_lazy_chunks_are_full_pass_shards_and_resume(tmp_path, monkeypatch):
    """A run resumed from a checkpoint reuses the finished shards (nothing sampled again), those sampled from the
    frozen reference after the first update included; a full pass on the same cache samples only the shards the lazy
    run did not: the entries are shared because they hold the same values."""
    calls = _count_shards(monkeypatch)
    save = dict(save_strategy="steps", save_steps=1)
    first = _apo(tmp_path, tmp_path / "cache", lazy=True, **save)
    first.train()
    done = list(first._lazy.done)
    assert sorted(calls) == sorted(done) and max(first._lazy.steps) > 0
    calls.clear()
    again = _apo(tmp_path, tmp_path / "cache", lazy=True, **save)
    again.train(resume_from_checkpoint=str(tmp_path / "lazy" / "checkpoint-1"))
    assert calls == [] and again._lazy.steps == [1]  # valued at step 1, from the frozen reference, from the cache
    assert again._lazy.values and all(first._lazy.values[r] == v for r, v in again._lazy.values.items())
    full = _apo(tmp_path, tmp_path / "cache", lazy=False)
    assert sorted(calls) == sorted(set(range(ROWS // SHARD)) - set(done))
    assert all(full.train_dataset[r]["ref_value"] == v for r, v in first._lazy.values.items())


def test_second_train_call_values_from_the_reference(tmp_path, monkeypatch):
    """``train()`` called again on the same trainer (no resume) starts again at step 0 with a trained policy: the
    chunks it values are still sampled from the frozen reference, with the full pass's values."""
    from trl_variants import _offline

    lazy = _apo(tmp_path, tmp_path / "cache_lazy", lazy=True, max_steps=1)
    sampled_from = []
    presample_fn = _offline.presample

    def watched(model, *a, **k):
        sampled_from.append((lazy.state.global_step, "reference" if model is lazy.ref_model else "policy"))
        return presample_fn(model, *a, **k)

    monkeypatch.setattr(_offline, "presample", watched)
    lazy.train()
    assert sampled_from == [(0, "policy")]  # before the first update the policy is the reference
    first = dict(lazy._lazy.values)
    lazy.args.seed = 1  # another sampler order: the second call's first batch holds prompts the first did not value
    lazy.train()
    assert len(sampled_from) > 1 and all(src == "reference" for _, src in sampled_from[1:]), sampled_from
    assert sampled_from[1][0] == 0  # at step 0 again (the step count alone would say "not trained yet")
    new = {r: v for r, v in lazy._lazy.values.items() if r not in first}
    assert new
    full = _apo(tmp_path, tmp_path / "cache_full", lazy=False, seed=1)  # the pass's seed is the run's
    for r, value in new.items():
        assert value == full.train_dataset[r]["ref_value"], r


def test_presample_shards_are_the_full_pass_rows(tmp_path):
    """presample(shards=...) returns the rows of those shards with exactly the values of the whole pass."""
    config = PresampleConfig(num_samples=2, max_completion_length=16, shard_size=3, value_beta=0.5,
                             record_prompt_logp=False, cache_dir=str(tmp_path / "a"), show_progress=False)
    data = train_dataset(10)
    whole = presample(DEFAULT_MODEL_PATH, None, data, accuracy_reward, config)
    config.cache_dir = str(tmp_path / "b")
    part = presample(DEFAULT_MODEL_PATH, None, data, accuracy_reward, config, shards=[3, 1])
    assert part["prompt"] == [data[r]["prompt"] for r in (3, 4, 5, 9)]
    for i, r in enumerate((3, 4, 5, 9)):
        assert part[i]["ref_value"] == whole[r]["ref_value"] and part[i]["ref_completion_ids"] == \
            whole[r]["ref_completion_ids"]
    with pytest.raises(ValueError, match="shards must be distinct"):
        presample(DEFAULT_MODEL_PATH, None, data, accuracy_reward, config, shards=[4])


def test_lazy_refused_where_unsafe(tmp_path):
    common = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, lazy_value_pass=True)
    with pytest.raises(ValueError, match="filter_all_incorrect"):
        APOConfig(filter_all_incorrect=True, **common)
    with pytest.raises(ValueError, match="use_vllm"):
        APOConfig(use_vllm=True, **common)
    rows = list(train_dataset(8))
    stream = IterableDataset.from_generator(lambda: iter(rows))
    with pytest.raises(ValueError, match="map-style"):
        _apo(tmp_path, tmp_path / "cache", lazy=True, dataset=stream)
    assert APOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False).lazy_value_pass is None  # auto


def test_default_is_lazy_where_safe_and_it_saves_work(tmp_path):
    """``lazy_value_pass=None`` (default): lazy when the run reaches fewer shards than the dataset has and nothing
    makes it unsafe; else the full pass in __init__ (``ref_value`` on the training rows). Never an error."""
    def stage1(trainer):
        return "lazy" if trainer._lazy is not None else "full" if "ref_value" in trainer.train_dataset.column_names \
            else "?"

    short = _apo(tmp_path, tmp_path / "cache", lazy=None, max_steps=1)  # 4 of 32 rows: at most 4 of 8 shards
    assert stage1(short) == "lazy" and len(short._lazy.order) == 4
    whole = _apo(tmp_path, tmp_path / "cache", lazy=None, max_steps=8)  # 32 rows: every shard, nothing to save
    assert stage1(whole) == "full"
    one_shard = _apo(tmp_path, tmp_path / "cache", lazy=None, max_steps=1, presample_shard_size=64)
    assert stage1(one_shard) == "full"  # the 4 rows reached live in the dataset's only shard


def test_default_full_pass_where_lazy_is_unsafe(tmp_path):
    trainer = _apo(tmp_path, tmp_path / "cache", lazy=None, max_steps=1, filter_all_incorrect=True)
    assert trainer._lazy is None and "ref_value" in trainer.train_dataset.column_names
    rows = list(train_dataset(ROWS))
    stream = IterableDataset.from_generator(lambda: iter(rows))
    streamed = _apo(tmp_path, tmp_path / "cache", lazy=None, max_steps=1, dataset=stream)
    assert streamed._lazy is None  # read once, in full, as before
    from peft import (
        LoraConfig,  # PEFT: the cache key holds the adapter, so post-update chunks would not be shared
    )

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    peft = _apo(tmp_path, tmp_path / "cache", lazy=None, max_steps=1, peft_config=lora)
    assert peft._lazy is None and "ref_value" in peft.train_dataset.column_names


def test_lazy_prompt_without_value_is_left_out_of_the_loss(tmp_path, monkeypatch):
    """A prompt none of whose reference samples got a reward has no V_hat: the full pass leaves it out of the
    dataset; the lazy pass gives its rows weight 0 in the loss (warning, ``apo/unvalued_fraction``), the others
    1 / (valued rows per micro-batch). When no prompt valued so far has a value, it stops as the full pass does."""
    def no_reward(completions, **kwargs):
        return [None] * len(completions)

    def args(name, **kw):
        return small_config(APOConfig, tmp_path / name, num_generations=1, num_value_samples=2,
                            per_device_train_batch_size=4, presample_shard_size=SHARD, lazy_value_pass=True,
                            presample_cache_dir=str(tmp_path / name / "c"), logging_steps=1, **kw)

    trainer = APOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=[no_reward], args=args("none"),
                         train_dataset=train_dataset(8))
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="no prompt has a value estimate"):
        trainer.train()
    assert trainer._lazy.values and all(math.isnan(v) for v in trainer._lazy.values.values())

    data = train_dataset(8)
    scored = {str(p) for p in data["prompt"][:4]}

    def some_reward(prompts, completions, **kwargs):  # the first 4 prompts (rows 0-3) are scored, the others never
        return [float(len(str(c)) % 2) if str(p) in scored else None
                for p, c in zip(prompts, completions, strict=True)]

    calls = []
    apo_loss = losses.apo_loss

    def recorded(seq_log_ratio, rewards, values, beta, weights=None):
        loss = apo_loss(seq_log_ratio, rewards, values, beta, weights=weights)
        calls.append((seq_log_ratio.detach(), rewards, values, beta, weights, loss.detach()))
        return loss

    monkeypatch.setattr(losses, "apo_loss", recorded)
    trainer = APOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=[some_reward],
                         args=args("some", max_steps=4, check_binary_rewards=False), train_dataset=data)
    reached = _watch_reached(trainer)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.warns(UserWarning, match="left out of the loss"):
        trainer.train()
    unvalued = {r for r, v in trainer._lazy.values.items() if not math.isfinite(v)}
    assert unvalued == trainer._lazy.unvalued == set(range(4, 8))
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    per_step = [sum(r >= 4 for r in reached[i:i + 4]) for i in range(0, len(reached), 4)]
    logged = [h.get("apo/unvalued_fraction", 0.0) for h in trainer.state.log_history if "loss" in h]
    assert len(per_step) == len(calls) == 4 and logged == [n / 4 for n in per_step] and 0 < sum(per_step) < 16
    for (ratio, rewards, values, beta, weights, loss), n_unvalued in zip(calls, per_step, strict=True):
        if n_unvalued == 0:  # no row left out: GRPO-style mean, no weights
            assert weights is None
            continue
        kept = weights > 0
        assert int((~kept).sum()) == n_unvalued
        if n_unvalued < 4:  # by hand: the mean of the squares over the valued rows only
            assert torch.allclose(weights[kept], torch.full_like(weights[kept], 1 / (4 - n_unvalued)))
            squares = (beta * ratio - (rewards - values)) ** 2
            assert loss.item() == pytest.approx(squares[kept].mean().item(), rel=1e-6)
        else:
            assert loss.item() == 0.0
    for (_, _, values, _, weights, _), h in zip(calls, [h for h in trainer.state.log_history if "loss" in h],
                                                 strict=True):  # logged means: over the rows in the loss
        kept = torch.ones_like(values, dtype=torch.bool) if weights is None else weights > 0
        if kept.any():
            assert h["apo/value_mean"] == pytest.approx(values[kept].mean().item(), rel=1e-6)



@pytest.mark.parametrize("kw", [dict(gradient_accumulation_steps=2), dict(num_iterations=2, steps_per_generation=2),
                                dict(shuffle_dataset=False, max_steps=3), dict(max_steps=-1, num_train_epochs=2)],
                         ids=["accumulation", "iterations", "in_order", "epochs"])
def test_sampler_order_is_the_order_the_run_asks_for(tmp_path, kw):
    """The look-ahead follows the rows the run really asks for, in their order of first use."""
    dataset = train_dataset(12) if "num_train_epochs" in kw else None
    trainer = _apo(tmp_path, tmp_path / "cache", lazy=True, dataset=dataset, **kw)
    reached = _watch_reached(trainer)
    trainer.train()
    assert list(dict.fromkeys(reached)) == trainer._lazy.order
