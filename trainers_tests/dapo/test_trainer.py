"""Dynamic sampling in real trainers on the tiny default: with a signal in every group it is GRPOTrainer exactly;
with all-equal groups it refills, trains and logs, in GRPO (composed trainer) and in ERPO, EEPO and DPH-RL; it
resumes where its refill stream stood; bad inputs are refused before the model loads."""

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from trl_variants import ComposedConfig, ComposedTrainer
from trl_variants.dapo.part import RefillStream

from ..helpers import DEFAULT_MODEL_PATH, SMALL_METHOD_ARGS, TRAINERS, small_config, train_dataset


def row_index_reward(completions, **kwargs):
    """A different reward for every row of a call: every group has a signal."""
    return [float(i) for i in range(len(completions))]


def half_constant_reward(prompts, completions, **kwargs):
    """Constant (1) on about half of the prompts (no signal there), the completion's length parity on the others."""
    return [1.0 if sum(map(ord, str(p))) % 2 else float(len(str(c)) % 2)
            for p, c in zip(prompts, completions, strict=True)]


def first_group_wrong_reward(prompts, completions, **kwargs):
    """0 on every completion of the call's first prompt (a constant group, whatever was sampled), the completion's
    length parity on the others. (:func:`half_constant_reward` is constant only where the batch's prompts happen to
    have an odd sum; with the two prompts of the first batch even, the refill test depended on sampled lengths and
    failed under torch 2.6's sampling.)"""
    return [0.0 if p == prompts[0] else float(len(str(c)) % 2) for p, c in zip(prompts, completions, strict=True)]


def _composed(tmp_path, reward, parts=("dapo_dynamic_sampling",), **kw):
    return ComposedTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=reward, train_dataset=train_dataset(16),
                           args=small_config(ComposedConfig, tmp_path, parts=list(parts), **kw))


def _weights(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def _logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


def test_signal_in_every_group_is_grpo_exactly(tmp_path):
    grpo = GRPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=row_index_reward, train_dataset=train_dataset(16),
                       args=small_config(GRPOConfig, tmp_path / "grpo"))
    grpo.train()
    ds = _composed(tmp_path / "ds", row_index_reward)  # built after GRPO trained: the same seeded start
    ds.train()
    assert _logged(ds, "dynamic_sampling/rounds") == [1.0, 1.0]
    assert _logged(ds, "dynamic_sampling/kept_fraction") == [1.0, 1.0]
    a, b = _weights(grpo), _weights(ds)
    assert all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("method", ["grpo", "erpo", "eepo", "dph"])
def test_refills_and_trains_in_every_grpo_family_trainer(tmp_path, method):
    if method == "grpo":
        trainer = _composed(tmp_path, first_group_wrong_reward, dynamic_sampling_max_rounds=3, max_steps=1,
                            max_completion_length=16)
    else:
        trainer_cls, config_cls = TRAINERS[method]
        kw = dict(SMALL_METHOD_ARGS[method], dynamic_sampling=True, dynamic_sampling_max_rounds=3, max_steps=1,
                  max_completion_length=16)
        if method == "dph":
            kw["presample_cache_dir"] = str(tmp_path / "cache")
        trainer = trainer_cls(model=DEFAULT_MODEL_PATH, reward_funcs=first_group_wrong_reward,
                              train_dataset=train_dataset(16), args=small_config(config_cls, tmp_path, **kw))
    assert trainer.part("dapo_dynamic_sampling").max_rounds == 3
    before = _weights(trainer)
    trainer.train()
    rounds = _logged(trainer, "dynamic_sampling/rounds")
    assert len(rounds) == 1 and rounds[0] > 1  # some groups were constant: the batch was refilled
    assert all(0 < f < 1 for f in _logged(trainer, "dynamic_sampling/kept_fraction"))
    dropped = [_logged(trainer, f"dynamic_sampling/dropped_all_{kind}")[0] for kind in ("correct", "wrong")]
    assert sum(dropped) > 0  # (DPH-RL: its all-correct prompts went to D_pef, so D_exp's dropped groups are wrong)
    after = _weights(trainer)
    assert any(not torch.equal(before[n], after[n]) for n in before)


@pytest.mark.slow
def test_resume_continues_the_refill_stream(tmp_path):
    out = tmp_path / "run"
    kw = dict(save_strategy="steps", save_steps=2, output_dir=str(out), dynamic_sampling_max_rounds=3)
    taken = []
    original = RefillStream.take

    def spy(self, size, n):
        got = original(self, size, n)
        taken.append(got)
        return got

    RefillStream.take = spy
    try:
        straight = _composed(out, half_constant_reward, max_steps=3, **kw)
        straight.train()
        refills_before_step_3 = sum(int(r) - 1 for r in _logged(straight, "dynamic_sampling/rounds")[:2])
        at_step_3 = taken[refills_before_step_3:]
        assert at_step_3  # step 3 refilled
        taken.clear()
        resumed = _composed(tmp_path / "resumed", half_constant_reward, max_steps=3,
                            **dict(kw, output_dir=str(tmp_path / "resumed")))
        resumed.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    finally:
        RefillStream.take = original
    assert resumed.state.global_step == 3
    assert taken == at_step_3  # step 3 refilled from where the checkpoint left the stream
    assert resumed.part("dapo_dynamic_sampling").state() == straight.part("dapo_dynamic_sampling").state()


def test_config_and_refusals(tmp_path):
    common = dict(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    assert ComposedConfig(parts=[], dynamic_sampling=True, **common).parts == ["dapo_dynamic_sampling"]
    assert ComposedConfig(parts=["dapo_dynamic_sampling"], **common).dynamic_sampling is True
    with pytest.raises(ValueError, match="dynamic_sampling_max_rounds"):
        ComposedConfig(parts=["dapo_dynamic_sampling"], dynamic_sampling_max_rounds=0, **common)


def test_streaming_dataset_refills_from_a_seeded_shuffle_of_the_stream(tmp_path):
    """A streaming IterableDataset (GRPOTrainer trains on one with max_steps): the refill prompts are read from a
    seeded shuffle of the stream, the batch is refilled and the model trains."""
    stream = Dataset.from_list([dict(r) for r in train_dataset(16)]).to_iterable_dataset()
    trainer = ComposedTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=half_constant_reward, train_dataset=stream,
                              args=small_config(ComposedConfig, tmp_path, parts=["dapo_dynamic_sampling"],
                                                dynamic_sampling_max_rounds=3, max_steps=1, max_completion_length=16))
    before = _weights(trainer)
    trainer.train()
    rounds = _logged(trainer, "dynamic_sampling/rounds")
    assert len(rounds) == 1 and rounds[0] > 1
    part = trainer.part("dapo_dynamic_sampling")
    assert part.stream.pos == (rounds[0] - 1) * 2  # 2 prompts (8 rows / G 4) per refill round, read from the stream
    after = _weights(trainer)
    assert any(not torch.equal(before[n], after[n]) for n in before)
