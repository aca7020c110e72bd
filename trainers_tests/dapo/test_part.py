"""DAPO's dynamic sampling: the keep rule, the refill stream and the batch it fills, by hand (a stand-in trainer whose
rollout returns scripted rewards), then in a real trainer: off-by-signal it is GRPO exactly, on it trains and logs."""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator

from trl_variants.dapo import DynamicSampling, groups_with_signal
from trl_variants.dapo.part import RefillStream

nan = float("nan")


def test_keep_rule_by_hand():
    rewards = torch.tensor([[1.0], [1.0], [0.0], [1.0], [0.0], [0.0], [nan], [1.0], [nan], [nan], [0.5], [0.2]])
    kept = groups_with_signal(rewards, torch.tensor([1.0]), 2)
    assert kept.tolist() == [False, True, False, False, False, True]  # all-1, mixed, all-0, one scored, none, mixed


def test_keep_rule_weights_and_aggregation():
    # two functions, weights (1, 2): rows (1, 0) and (0, 0.5) both sum to 1 -> no signal when summed first,
    # but each function varies -> a signal when each function is normalized in its group first
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.5], [1.0, 1.0], [1.0, 1.0]])
    w = torch.tensor([1.0, 2.0])
    assert groups_with_signal(rewards, w, 2).tolist() == [False, False]
    assert groups_with_signal(rewards, w, 2, "normalize_then_sum").tolist() == [True, False]


def test_refill_stream_is_seeded_wraps_and_resumes():
    a = RefillStream(seed=3)
    first = a.take(5, 3) + a.take(5, 3)  # crosses into the second epoch
    assert sorted(first[:5]) == [0, 1, 2, 3, 4] and (a.epoch, a.pos) == (1, 1)
    b = RefillStream(seed=3)
    b.epoch, b.pos = 1, 1  # resumed from a checkpoint
    assert a.take(5, 4) == b.take(5, 4)
    assert RefillStream(seed=4).take(5, 5) != RefillStream(seed=3).take(5, 5)


def test_refill_stream_reads_a_streaming_dataset_seeded_wraps_and_resumes():
    from datasets import Dataset

    stream = Dataset.from_list([{"id": i} for i in range(5)]).to_iterable_dataset()
    a = RefillStream(seed=3)
    first = [r["id"] for r in a.rows(stream, 3) + a.rows(stream, 3)]  # crosses into the second epoch
    assert sorted(first[:5]) == [0, 1, 2, 3, 4] and (a.epoch, a.pos) == (1, 1)
    assert first[:5] == [r["id"] for r in stream.shuffle(seed=3 * 1_000_033 + 7, buffer_size=1000)]
    b = RefillStream(seed=3)
    b.epoch, b.pos = 1, 1  # resumed from a checkpoint
    assert [r["id"] for r in a.rows(stream, 4)] == [r["id"] for r in b.rows(stream, 4)]
    long = Dataset.from_list([{"id": i} for i in range(20)]).to_iterable_dataset()
    assert RefillStream(seed=4).rows(long, 20) != RefillStream(seed=3).rows(long, 20)
    empty = Dataset.from_list([{"id": 0}]).to_iterable_dataset().filter(lambda row: False)
    with pytest.raises(ValueError, match="yields no rows"):
        RefillStream(seed=0).rows(empty, 1)


# ----------------------------------------------------------------------------- the fill, with scripted rounds ---
def _fake_trainer(dataset, script, G=2, max_rounds=4):
    """A stand-in with what DynamicSampling reads; ``script`` gives each round's rewards per row."""
    rounds = iter(script)
    seen = []

    def rollout(inputs):
        rewards = torch.tensor(next(rounds), dtype=torch.float32).unsqueeze(1)
        trainer._rollout_rewards = rewards
        seen.append([x["id"] for x in inputs])
        n = len(inputs)
        width = 1 + len(seen)  # each round pads its completions to its own width
        ids = torch.tensor([[x["id"]] * width for x in inputs])
        return {"prompt_ids": torch.tensor([[0, x["id"]] for x in inputs]),
                "prompt_mask": torch.ones(n, 2, dtype=torch.long),
                "completion_ids": ids, "completion_mask": torch.ones(n, width, dtype=torch.long),
                "advantages": rewards.squeeze(1) - rewards.view(-1, G).mean(1).repeat_interleave(G),
                "num_items_in_batch": torch.tensor(n * width)}

    trainer = SimpleNamespace(
        accelerator=Accelerator(cpu=True), num_generations=G, reward_weights=torch.tensor([1.0]),
        multi_objective_aggregation="sum_then_normalize", _metrics={"train": defaultdict(list)},
        train_dataset=dataset, _tokenizer=SimpleNamespace(pad_token_id=-1), pad_to_multiple_of=None,
        vllm_importance_sampling_mode="token_truncate")
    return trainer, DynamicSampling(max_rounds, seed=0), rollout, seen


def _dataset(n=6):
    return [{"id": 100 + i, "prompt": f"p{i}"} for i in range(n)]


def _rows(batch):
    return [x["id"] for x in batch]


def test_fill_keeps_groups_with_a_signal_and_refills_in_order():
    ds = _dataset()
    # round 1: groups (a, b, c): a all-correct, b mixed, c all-wrong; round 2 (refill): mixed, all-equal, mixed
    trainer, part, rollout, seen = _fake_trainer(ds, [[1, 1, 0, 1, 0, 0], [1, 0, 0, 0, 0.5, 0]])
    first = [{"id": i, "prompt": "x"} for i in (1, 1, 2, 2, 3, 3)]
    inputs, out = part.fill(trainer, first, rollout)
    refill = [ds[i]["id"] for i in RefillStream(seed=0).take(len(ds), 3)]
    assert seen[1] == [p for p in refill for _ in range(2)]  # the next 3 prompts of the seeded stream, G times each
    assert _rows(inputs) == [2, 2, refill[0], refill[0], refill[2], refill[2]]  # round 1's b, then round 2's 1st, 3rd
    assert out["completion_ids"][:, 0].tolist() == _rows(inputs)
    assert out["completion_ids"].shape == (6, 3)  # the widest round's width, no unused column
    assert out["completion_ids"][0].tolist() == [2, 2, -1]  # round 1's rows padded on the right with pad id
    assert out["completion_mask"].sum().item() == 2 * 2 + 4 * 3
    assert out["num_items_in_batch"].item() == 16
    m = trainer._metrics["train"]
    assert m["dynamic_sampling/rounds"] == [2.0] and m["dynamic_sampling/kept_fraction"] == [3 / 6]
    assert m["dynamic_sampling/dropped_all_correct"] == [1.0] and m["dynamic_sampling/dropped_all_wrong"] == [2.0]
    assert m["dynamic_sampling/unfilled_groups"] == [0.0]
    assert part.state() == {"dapo_refill_epoch": 0, "dapo_refill_pos": 3}


def test_fill_round_one_full_is_grpos_batch_untouched():
    trainer, part, rollout, _ = _fake_trainer(_dataset(), [[1, 0, 0, 1, 1, 0]])
    first = [{"id": i, "prompt": "x"} for i in (1, 1, 2, 2, 3, 3)]
    inputs, out = part.fill(trainer, first, rollout)
    assert inputs is first and part.state()["dapo_refill_pos"] == 0
    assert trainer._metrics["train"]["dynamic_sampling/rounds"] == [1.0]


def test_fill_stops_at_the_bound_and_masks_the_unfilled_places(caplog):
    trainer, part, rollout, seen = _fake_trainer(_dataset(), [[1, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1]], max_rounds=2)
    first = [{"id": i, "prompt": "x"} for i in (1, 1, 2, 2, 3, 3)]
    with caplog.at_level("WARNING"):
        inputs, out = part.fill(trainer, first, rollout)
    assert len(seen) == 2  # the bound: two rounds
    # one group with a signal (round 1's second) and the first two dropped groups, masked out of the loss, in order
    assert _rows(inputs)[:2] == [1, 1] and _rows(inputs)[2:4] == [2, 2] and _rows(inputs)[4:] == [3, 3]
    assert out["completion_mask"].sum(1).tolist() == [0, 0, 2, 2, 0, 0]
    assert out["num_items_in_batch"].item() == 4
    assert trainer._metrics["train"]["dynamic_sampling/unfilled_groups"] == [2.0]
    assert "dynamic_sampling_max_rounds" in caplog.text and caplog.text.count("Said once") == 1


def test_fill_with_no_signal_anywhere_trains_on_nothing():
    trainer, part, rollout, _ = _fake_trainer(_dataset(), [[1, 1, 0, 0, 1, 1]], max_rounds=1)
    first = [{"id": i, "prompt": "x"} for i in (1, 1, 2, 2, 3, 3)]
    inputs, out = part.fill(trainer, first, rollout)
    assert _rows(inputs) == [1, 1, 2, 2, 3, 3] and out["completion_mask"].sum().item() == 0
    assert out["num_items_in_batch"].item() == 0


def test_the_fix_that_turns_it_off_names_the_parts_list_of_a_composed_run():
    from types import SimpleNamespace

    from trl_variants.dapo.part import _turn_off

    assert _turn_off(SimpleNamespace(parts=["dapo_dynamic_sampling"])).startswith("drop 'dapo_dynamic_sampling' from parts")
    assert _turn_off(SimpleNamespace(dynamic_sampling=True)) == "set dynamic_sampling=False"
