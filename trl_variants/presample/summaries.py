"""Per-prompt columns the pass computes from each prompt's sampled rewards, declared by the method that reads them.

The pass knows a summary's column, the :class:`~trl_variants.presample.PresampleConfig` option that asks for it (and
is its parameter), and nothing of its formula or of what makes its stored values plausible: the method's own module
registers a :class:`RewardSummary` with both. A*-PO's ``ref_value`` (its eq. 1, the value estimate V_hat) is
``trl_variants/apo/value.py``. The shipped methods' summaries are imported on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RewardSummary:
    """``column``: the column the pass adds (one float per prompt); ``option``: the ``PresampleConfig`` field that
    asks for it (None there: not computed) and is passed to ``compute``; ``compute(rewards, parameter)``: the value
    from the prompt's rewards that are finite (not called when none is: the column holds NaN); ``check(dataset,
    reader, fix)``: raises, naming ``reader``, the rows and ``fix``, when a stored column holds values ``compute``
    cannot have made (None: not checked)."""

    column: str
    option: str
    compute: Callable[[list[float], float], float]
    check: Callable[..., None] | None = None


_REGISTRY: dict[str, RewardSummary] = {}
_BUILTIN = ("apo.value",)  # modules that register a summary on import


def register_reward_summary(summary: RewardSummary) -> RewardSummary:
    """Make ``summary`` known to the pass (a column registered again is replaced: a module reloaded)."""
    _REGISTRY[summary.column] = summary
    return summary


def reward_summaries() -> list[RewardSummary]:
    """Every registered summary, the shipped methods' first."""
    for module in _BUILTIN:
        importlib.import_module(f"{__package__.rpartition('.')[0]}.{module}")
    return list(_REGISTRY.values())


def requested(config) -> list[tuple[RewardSummary, float]]:
    """The summaries ``config`` asks for, each with its parameter (the option's value)."""
    return [(s, getattr(config, s.option)) for s in reward_summaries() if getattr(config, s.option, None) is not None]


def reward_summary(column: str) -> RewardSummary | None:
    """The summary that makes ``column``, or None."""
    return next((s for s in reward_summaries() if s.column == column), None)
