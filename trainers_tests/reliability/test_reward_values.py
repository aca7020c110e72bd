"""What reward functions return is checked, by the trainers and by the offline pass alike: a
string, a non-number, an infinite value or the wrong number of values is refused at the call that returned it,
naming the function, the completion, the value and its type, and the fix. None (no reward) stays allowed, as in TRL.
GRPOTrainer used to fail later with "too many dimensions 'str'"."""

from __future__ import annotations

import asyncio
import functools
import inspect
import math

import numpy as np
import pytest
import torch
from trl.trainer.utils import get_callable_name, is_async_callable

from trl_variants import accuracy_reward
from trl_variants._validation import AsyncCheckedReward, CheckedReward, checked_reward_funcs, reward_values
from trl_variants.presample.reward_calls import check_reward_columns, reward_fingerprint, score_completions

from ..helpers import TRAINERS, small_trainer, train_dataset

FIX = r"return a list with one number per completion \(None: no reward for that completion\)"


def string_reward(completions, **kwargs):
    return ["1.0" for _ in completions]


def _training(trainer_state) -> bool:
    """Whether training runs: the offline pass, in the trainer's __init__, sees the trainer's state before train()
    sets max_steps."""
    return trainer_state is not None and trainer_state.max_steps > 0


def late_string_reward(completions, trainer_state=None, **kwargs):
    """Numbers in the offline pass (half right, so DPH-RL keeps prompts to explore and A*-PO prompts with a right
    sample), strings once training runs."""
    return [float(i % 2) if not _training(trainer_state) else "1.0" for i in range(len(completions))]


def late_short_reward(completions, trainer_state=None, **kwargs):
    return [0.5] * (len(completions) - _training(trainer_state))


# ----------------------------------------------------------------------------------------- the shared check ---
def test_reward_values_converts_numbers_and_none():
    values = [1, 0.5, True, None, np.float32(0.25), torch.tensor(2.0), float("nan")]
    out = reward_values(values, accuracy_reward, 7)
    assert out[:3] == [1.0, 0.5, 1.0] and math.isnan(out[3]) and out[4:6] == [0.25, 2.0] and math.isnan(out[6])
    assert reward_values(np.array([1.0, 0.0]), accuracy_reward, 2) == [1.0, 0.0]
    assert reward_values(torch.tensor([0.0, 3.0]), accuracy_reward, 2) == [0.0, 3.0]


@pytest.mark.parametrize("values,error,message", [
    (["1.0", 0.0], TypeError, r"returned '1\.0' \(str\) for completion 0 of 2"),
    ([0.0, [1.0]], TypeError, r"returned \[1\.0\] \(list\) for completion 1 of 2"),
    ([0.0, {"r": 1}], TypeError, r"returned \{'r': 1\} \(dict\) for completion 1 of 2"),
    ([0.0, 1j], TypeError, r"returned 1j \(complex\) for completion 1 of 2"),
    (0.5, TypeError, r"returned 0\.5 \(float\) for 2 completions"),
    (None, TypeError, r"returned None \(NoneType\) for 2 completions"),
    ("10", TypeError, r"returned '10' \(str\) for 2 completions"),
    (torch.zeros(2, 1), TypeError, r"returned tensor\(\[\[0\.\], \[0\.\]\]\) \(Tensor\) for 2 completions"),
    ([1.0], ValueError, r"returned 1 values for 2 completions"),
])
def test_reward_values_refuses_what_trl_cannot_use(values, error, message):
    with pytest.raises(error, match=rf"reward function 'accuracy_reward' {message}: .*{FIX}"):
        reward_values(values, accuracy_reward, 2)


def test_reward_values_refuses_infinite_rewards():
    with pytest.raises(ValueError, match=r"'accuracy_reward' returned -inf for completion 1 of 2: an infinite reward "
                                         r"makes its group's advantages NaN.*or None for no reward"):
        reward_values([0.0, -math.inf], accuracy_reward, 2)


def test_offline_pass_uses_the_same_check():
    with pytest.raises(TypeError, match=rf"'string_reward' returned '1\.0' \(str\) for completion 0 of 2: .*{FIX}"):
        score_completions([string_reward], [1.0], ["p", "q"], ["a", "b"], [[1], [2]], {})
    total, per_func = score_completions([accuracy_reward, lambda completions, **k: [None, 0.5]], [1.0, 2.0],
                                        ["p", "q"], ["\\boxed{1}", "x"], [[1], [2]], {"solution": ["1", "2"]})
    assert total == [1.0, 1.0] and math.isnan(per_func[0][1]) and per_func[1] == [0.0, 0.5]


# ------------------------------------------------------------------------------------------- the wrapper ---
def test_wrapper_keeps_name_signature_and_cache_fingerprint():
    checked = checked_reward_funcs(accuracy_reward)
    assert isinstance(checked, CheckedReward) and get_callable_name(checked) == "accuracy_reward"
    assert inspect.signature(checked) == inspect.signature(accuracy_reward)
    assert reward_fingerprint(checked) == reward_fingerprint(accuracy_reward) is not None
    with pytest.raises(ValueError, match="needs the dataset column 'solution'"):  # the offline pass's column check
        check_reward_columns([checked], ["prompt"])
    partial = checked_reward_funcs([functools.partial(string_reward, unused=1)])[0]
    assert get_callable_name(partial) == "string_reward"
    assert checked_reward_funcs(None) is None and checked_reward_funcs("org/reward-model") == "org/reward-model"
    assert checked_reward_funcs([checked])[0] is checked  # never wrapped twice
    out = checked(prompts=["p"], completions=["\\boxed{1}"], solution=["1"])
    assert out == [1.0]


def test_wrapper_keeps_async_functions_async():
    async def async_string_reward(completions, **kwargs):
        return ["x" for _ in completions]

    async def async_reward(completions, **kwargs):
        return [0.5, None]

    checked = checked_reward_funcs([async_string_reward, async_reward])
    assert all(isinstance(f, AsyncCheckedReward) and is_async_callable(f) for f in checked)
    with pytest.raises(TypeError, match=rf"'async_string_reward' returned 'x' \(str\) for completion 0 of 2: .*{FIX}"):
        asyncio.run(checked[0](prompts=["p", "q"], completions=["a", "b"]))
    out = asyncio.run(checked[1](prompts=["p", "q"], completions=["a", "b"]))
    assert out[0] == 0.5 and math.isnan(out[1])


# ------------------------------------------------------------------------------------------ the trainers ---
def _params(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


STRING_MESSAGE = r"'late_string_reward' returned '1\.0' \(str\) for completion 0 of 8"


@pytest.mark.parametrize("method,reward,message", [
    *[pytest.param(m, late_string_reward, STRING_MESSAGE, id=m) for m in TRAINERS],
    pytest.param("erpo", late_short_reward, r"'late_short_reward' returned 7 values for 8 completions",
                 id="erpo-wrong-length"),
])
def test_trainers_refuse_bad_rewards_at_the_first_step(method, reward, message, tmp_path):
    """Raised at the first reward call of training (after the rollout's generation, which the value needs), before
    the loss forward and the update: every weight is unchanged."""
    overrides = {"entropy_gate": "never"} if method == "eepo" else {}
    trainer = small_trainer(method, tmp_path, dataset=train_dataset(8), reward_funcs=[reward], max_steps=1,
                            max_completion_length=8, **overrides)
    assert trainer.reward_func_names == [reward.__name__]  # TRL's metric names are unchanged
    before = _params(trainer)
    with pytest.raises((TypeError, ValueError), match=rf"reward function {message}: .*{FIX}"):
        trainer.train()
    after = dict(trainer.model.named_parameters())
    assert all(torch.equal(after[n].detach(), v) for n, v in before.items())


@pytest.mark.parametrize("method", ["dph", "apo"])
def test_offline_pass_refuses_bad_rewards_before_training(method, tmp_path):
    with pytest.raises(TypeError, match=rf"'string_reward' returned '1\.0' \(str\) for completion 0 of \d+: .*{FIX}"):
        small_trainer(method, tmp_path, dataset=train_dataset(8), reward_funcs=string_reward, max_completion_length=8)
