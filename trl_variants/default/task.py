"""Synthetic multi-step addition: the embedded default task.

A problem adds ``level + 1`` single digits (1-9). Each problem is a conversational ``prompt`` with a gold
``solution`` (the sum as a string) and two reference answers the tiny default model was pre-trained on:

=====  ==========================  ===================================================  =====================
level  prompt                      ``completion`` (step by step)                        ``direct`` (a guess)
=====  ==========================  ===================================================  =====================
1      ``What is 4 + 7?``          ``4 + 7 = 11. \\boxed{11}``                           ``\\boxed{11}``
2      ``What is 4 + 7 + 5?``      ``4 + 7 = 11, 11 + 5 = 16. \\boxed{16}``              ``\\boxed{16}``
3      ``What is 4 + 7 + 5 + 2?``  ``4 + 7 = 11, 11 + 5 = 16, 16 + 2 = 18. \\boxed{18}``  ``\\boxed{18}``
4      five digits                 four steps                                           ``\\boxed{..}``
=====  ==========================  ===================================================  =====================

Why this task: each step (a number up to 36 plus a digit) is easy for a 1M-parameter model, so answering step by
step is reliable at every level, while answering directly means adding up to five digits in one forward pass, which
the model does well only for two. The pre-training data mixes both styles (``scripts/build_tiny_default.py``), so
the base model often guesses where it should reason: at temperature 1 most prompts are solved sometimes but not
always, and RL has something to learn (prefer the steps where they pay off), visible in greedy accuracy too.

Everything is a pure function of the seed (``random.Random``), so datasets are reproducible across machines.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

LEVELS = (1, 2, 3, 4)
"""The levels the tiny default was pre-trained on and the default splits draw from."""
BEYOND_LEVELS = (5, 6)
"""Longer chains than any the model saw (6 and 7 digits), for held-out studies only (``benchmarks/heldout_split.py``):
the step-by-step answer still works one addition at a time, a direct guess of a 6- or 7-digit sum rarely does."""


@dataclass(frozen=True)
class Problem:
    level: int
    question: str
    completion: str  # the step-by-step reference answer, ending in \boxed{answer}
    answer: int

    @property
    def direct(self) -> str:
        """The reference answer without steps."""
        return f"\\boxed{{{self.answer}}}"


def _chain(digits: list[int]) -> Problem:
    steps, total = [], digits[0]
    for d in digits[1:]:
        steps.append(f"{total} + {d} = {total + d}")
        total += d
    question = "What is " + " + ".join(map(str, digits)) + "?"
    return Problem(len(digits) - 1, question, ", ".join(steps) + f". \\boxed{{{total}}}", total)


def generate_problem(rng: random.Random, level: int) -> Problem:
    """One problem of the given difficulty level (``level + 1`` digits to add), drawn from ``rng``."""
    if level not in LEVELS + BEYOND_LEVELS:
        raise ValueError(f"level must be one of {LEVELS + BEYOND_LEVELS}, got {level!r}")
    return _chain([rng.randint(1, 9) for _ in range(level + 1)])


def generate_problems(
    n: int, seed: int, levels: tuple[int, ...] = LEVELS, weights: tuple[float, ...] | None = None
) -> list[Problem]:
    """``n`` problems, levels drawn with ``weights`` (uniform by default), deterministic in ``seed``."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if weights is not None and len(weights) != len(levels):
        raise ValueError(f"weights has {len(weights)} entries but levels has {len(levels)}: give one weight per level")
    rng = random.Random(seed)
    return [generate_problem(rng, rng.choices(levels, weights=weights)[0]) for _ in range(n)]
