"""apo/value.py: A*-PO's eq. 1 per prompt, as the offline pass computes it (the pass only knows the column and the
option that asks for it: presample/summaries.py)."""

import math

import pytest

from trl_variants.apo import value
from trl_variants.presample import PresampleConfig
from trl_variants.presample.summaries import requested, reward_summary


def test_prompt_value_is_eq_1_by_hand():
    # beta1 = 0.5, rewards 1, 0, 0: 0.5 * log((e^2 + 1 + 1) / 3)
    assert value.prompt_value([1.0, 0.0, 0.0], 0.5) == pytest.approx(0.5 * math.log((math.exp(2) + 2) / 3), abs=1e-12)
    assert value.prompt_value([1.0, 1.0], 0.5) == pytest.approx(1.0, abs=1e-12)  # all correct: V_hat = 1


def test_the_pass_asks_apo_for_ref_value_only_with_value_beta():
    assert reward_summary("ref_value") is value.VALUE
    assert requested(PresampleConfig(num_samples=2, value_beta=0.25, use_cache=False)) == [(value.VALUE, 0.25)]
    assert requested(PresampleConfig(num_samples=2, use_cache=False)) == []
    assert reward_summary("ref_rewards") is None
