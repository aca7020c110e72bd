"""Synthetic arithmetic word problems: the embedded default task.

Four difficulty levels, each problem a conversational ``prompt`` with a gold ``solution`` (the final number as a
string) and the reference ``completion`` used to pre-train the tiny default model:

=====  ===========================================================  =============================================
level  prompt                                                       completion
=====  ===========================================================  =============================================
1      ``What is 4 + 7?`` (single digits)                           ``4 + 7 = 11. \\boxed{11}``
2      ``What is 83 - 16?`` (two-digit add / subtract)               ``83 - 16 = 67. \\boxed{67}``
3      ``Tom has 51 pens, gets 22, gives away 21. How many now?``   ``51 + 22 = 73. 73 - 21 = 52. \\boxed{52}``
4      ``What is 3 * 47 + 37?``                                      ``3 * 47 = 141. 141 + 37 = 178. \\boxed{178}``
=====  ===========================================================  =============================================

Everything is a pure function of the seed (``random.Random``), so datasets are reproducible across machines.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

LEVELS = (1, 2, 3, 4)
_NAMES = ("Tom", "Ana", "Li", "Sam", "Mia", "Raj", "Eva", "Kim")
_ITEMS = ("pens", "apples", "cards", "coins", "books", "shells", "stamps", "eggs")


@dataclass(frozen=True)
class Problem:
    level: int
    question: str
    completion: str  # reference reasoning line ending in \boxed{answer}
    answer: int


def _level1(rng: random.Random) -> Problem:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return Problem(1, f"What is {a} + {b}?", f"{a} + {b} = {a + b}. \\boxed{{{a + b}}}", a + b)


def _level2(rng: random.Random) -> Problem:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    if rng.random() < 0.5:
        return Problem(2, f"What is {a} + {b}?", f"{a} + {b} = {a + b}. \\boxed{{{a + b}}}", a + b)
    a, b = max(a, b), min(a, b)
    return Problem(2, f"What is {a} - {b}?", f"{a} - {b} = {a - b}. \\boxed{{{a - b}}}", a - b)


def _level3(rng: random.Random) -> Problem:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b = rng.randint(10, 60), rng.randint(10, 39)
    c = rng.randint(1, a + b)
    q = f"{name} has {a} {item}, gets {b}, gives away {c}. How many now?"
    s = a + b
    return Problem(3, q, f"{a} + {b} = {s}. {s} - {c} = {s - c}. \\boxed{{{s - c}}}", s - c)


def _level4(rng: random.Random) -> Problem:
    a, b, c = rng.randint(2, 9), rng.randint(10, 99), rng.randint(10, 99)
    p = a * b
    q = f"What is {a} * {b} + {c}?"
    return Problem(4, q, f"{a} * {b} = {p}. {p} + {c} = {p + c}. \\boxed{{{p + c}}}", p + c)


_GENERATORS = {1: _level1, 2: _level2, 3: _level3, 4: _level4}


def generate_problem(rng: random.Random, level: int) -> Problem:
    """One problem of the given difficulty level, drawn from ``rng``."""
    if level not in _GENERATORS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    return _GENERATORS[level](rng)


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
