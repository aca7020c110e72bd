"""A*-PO's stage 1 per prompt: the optimal value estimate, eq. (1) with N samples from the reference policy,

    V_hat(x) = beta1 * log( (1/N) sum_i exp(r_i / beta1) ),  r_i the rewards of N samples of pi_ref on x,

(``losses.optimal_value``; paper default beta1 = 0.5, ``APOConfig.value_beta``). The offline pass computes it for
each prompt as the column ``ref_value`` when its ``value_beta`` option is set (``trl-variants presample --value_beta``,
or the trainer's own stage 1): this module registers it with the pass (:mod:`trl_variants.presample.summaries`),
with the check of stored values (a soft maximum lies between the smallest and the largest reward). A sample without
a finite reward is left out; a prompt with none has no estimate (NaN) and stage 2 leaves it out.
"""

from __future__ import annotations

import math

import torch

from .. import losses
from .._validation import _rows, _shown
from ..presample.summaries import RewardSummary, register_reward_summary


def prompt_value(rewards: list[float], beta: float) -> float:
    """V_hat(x) of one prompt from its finite rewards."""
    return float(losses.optimal_value(torch.tensor(rewards, dtype=torch.float64), beta))


def check_values(dataset, reader: str, fix: str) -> None:
    """A stored ``ref_value`` column holds what :func:`prompt_value` can have made of the row's ``ref_rewards``:
    a number between their smallest and largest finite value (a rounding tolerance allowed), NaN when none is
    finite; refused naming the rows, an example and ``fix``."""
    values = dataset["ref_value"]
    rewards = dataset["ref_rewards"] if "ref_rewards" in dataset.column_names else [None] * len(values)
    bad, example = [], None
    for i, (v, rs) in enumerate(zip(values, rewards, strict=True)):
        finite = [r for r in rs or [] if isinstance(r, int | float) and math.isfinite(r)]
        if isinstance(v, bool) or not isinstance(v, int | float) or math.isinf(v):
            why = None
        elif rs is None:
            continue  # no rewards to compare with
        elif math.isnan(v):
            if not finite:
                continue  # no sample got a reward: no value estimate (A*-PO leaves the prompt out)
            why = f"{v!r} for rewards {_shown(rs)}"
        elif not finite or not (min(finite) - _tolerance(finite) <= v <= max(finite) + _tolerance(finite)):
            why = f"{v!r} for rewards {_shown(rs)}"
        else:
            continue
        bad.append(i)
        example = example or f"row {i}: {why or _shown(v)}"
    if bad:
        raise ValueError(f"{reader}: column 'ref_value' holds V_hat(x), a soft maximum of the row's 'ref_rewards' "
                         f"(between their smallest and largest; NaN when none is finite), but {_rows(bad)} do not "
                         f"(e.g. {example}). Fix: {fix}")


def _tolerance(values) -> float:
    return 1e-4 * (1.0 + max(abs(x) for x in values))


VALUE = register_reward_summary(RewardSummary("ref_value", "value_beta", prompt_value, check_values))
