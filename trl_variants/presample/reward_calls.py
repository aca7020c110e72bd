"""Calling TRL-signature reward functions outside a trainer: column checks and weighted scoring."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

_TRL_REWARD_KWARGS = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                      "environments", "kwargs"}


def reward_name(func) -> str:
    return getattr(func, "__name__", type(func).__name__)


def check_reward_columns(reward_funcs: Sequence[Callable], column_names: Sequence[str]) -> None:
    """Raise (naming the function and the column) when a reward function has a required parameter that is neither
    part of TRL's reward signature nor a dataset column."""
    for func in reward_funcs:
        try:
            params = inspect.signature(func).parameters.values()
        except (TypeError, ValueError):
            continue
        for p in params:
            if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) or p.default is not p.empty:
                continue
            if p.name not in _TRL_REWARD_KWARGS and p.name not in column_names:
                raise ValueError(
                    f"reward function {reward_name(func)!r} needs the dataset column {p.name!r}, which the dataset "
                    f"does not have (columns: {list(column_names)}): add it or rename a column to {p.name!r}"
                )


def score_completions(reward_funcs, reward_weights, prompts, completions, completion_ids, columns) -> list[float]:
    """Weighted sum of the reward functions, called with GRPOTrainer's reward signature (``prompts``,
    ``completions``, ``completion_ids``, every dataset column as a keyword list, ``trainer_state=None``, and no-op
    ``log_extra`` / ``log_metric``). ``None`` rewards count as 0."""
    total = [0.0] * len(completions)
    for func, weight in zip(reward_funcs, reward_weights, strict=True):
        values = func(prompts=prompts, completions=completions, completion_ids=completion_ids, trainer_state=None,
                      log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None, **columns)
        if len(values) != len(completions):
            raise ValueError(f"reward function {reward_name(func)!r} returned {len(values)} values for "
                             f"{len(completions)} completions")
        total = [t + weight * (0.0 if v is None else float(v)) for t, v in zip(total, values, strict=True)]
    return total
