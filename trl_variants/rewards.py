"""Reward functions with TRL's reward signature: ``f(prompts, completions, **dataset_columns) -> list[float]``.

Completions may be plain strings or conversational (``[{"role": "assistant", "content": ...}]``), as GRPOTrainer
passes them. Neither function ever raises on malformed model output: such output scores 0.0.

Every accuracy reward call is bounded in time, in any thread (docs/reliability.md, "Reward time bound"):

* the last ``\\boxed{...}`` is found in one linear pass (:func:`last_boxed`);
* a cheap pre-screen (:func:`prescreen`) refuses answers that would only make sympy compute for minutes
  (longer than ``MAX_ANSWER_CHARS``, a numeric exponent or tower above ``MAX_EXPONENT``, a factorial above
  ``MAX_FACTORIAL``); no answer of a math data set comes near these limits;
* math-verify runs in a persistent worker process (started lazily, reused, killed at interpreter exit) with a
  per-completion deadline (``REWARD_TIMEOUT_SECONDS``, environment variable ``TRL_VARIANTS_REWARD_TIMEOUT``,
  or :func:`make_accuracy_reward`): Python-level work is interrupted inside the worker, and a worker stuck in
  C code (a big-integer power holds the GIL) is killed and replaced by a warm spare (the workers: the private
  module ``_reward_pool.py``).

A refused or timed-out completion scores 0.0, is counted in the ``<name>/timeouts`` metric (TRL's
``log_metric``), and is reported in the log by count and length only, never by its text.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
from functools import lru_cache

if __package__:
    from ._reward_pool import _POOL as _POOL  # re-exported: the tests reach the workers as rewards._POOL
    from ._reward_pool import shutdown_reward_workers, verify_pairs
else:  # this file loaded alone, by its path (no package, so no torch): the pool module beside it, likewise
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "_trl_variants_reward_pool", os.path.join(os.path.dirname(os.path.abspath(__file__)), "_reward_pool.py"))
    _pool_module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_pool_module)
    _POOL, shutdown_reward_workers, verify_pairs = (
        _pool_module._POOL, _pool_module.shutdown_reward_workers, _pool_module.verify_pairs)

__all__ = [
    "accuracy_reward", "format_reward", "last_boxed", "completion_text", "REWARD_FUNCS", "AccuracyReward",
    "make_accuracy_reward", "prescreen", "shutdown_reward_workers", "REWARD_TIMEOUT_SECONDS",
]

logger = logging.getLogger(__name__)

_BOXED = "\\boxed{"


def _timeout_from_env(environ) -> float:
    """The default per-completion time bound: ``TRL_VARIANTS_REWARD_TIMEOUT`` (seconds) or 5."""
    raw = environ.get("TRL_VARIANTS_REWARD_TIMEOUT", "").strip()
    if not raw:
        return 5.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise ValueError(f"TRL_VARIANTS_REWARD_TIMEOUT must be a positive number of seconds, got {raw!r}")
    return value


# Seconds math-verify may spend on one completion (parse and verify) before it scores 0 as a timeout.
REWARD_TIMEOUT_SECONDS = _timeout_from_env(os.environ)
# Pre-screen limits: answers beyond them are refused (scored 0, counted as timeouts) without math-verify.
MAX_ANSWER_CHARS = 1000
MAX_EXPONENT = 10**6
MAX_FACTORIAL = 10**5
_RESULT_CACHE_SIZE = 1 << 16


def completion_text(completion) -> str:
    """The text of one completion, plain or conversational (last message's content)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content", "")
        return content if isinstance(content, str) else ""
    return ""


_BRACE = re.compile(r"[{}]")


def last_boxed(text: str) -> str | None:
    """Content of the last balanced ``\\boxed{...}`` in ``text``, or None when there is none.

    One right-to-left pass over the braces, O(len(text)): a ``{`` is balanced when a ``}`` after it closes it
    (every brace counts, as in a depth scan), and the first balanced ``\\boxed{`` met from the right is the
    last one.
    """
    if _BOXED not in text:
        return None
    end = len(text) - 1
    closers: list[int] = []  # positions of the '}' not yet matched, the nearest last
    for m in _BRACE.finditer(text[::-1]):
        pos = end - m.start()
        if text[pos] == "}":
            closers.append(pos)
        elif closers:
            close = closers.pop()
            if pos >= 6 and text.startswith("\\boxed", pos - 6):
                return text[pos + 1 : close]
    return None


# ``^`` then an exponent that starts with a number or a tower of numbers: ``^7``, ``^{10^{9}}``, ``^{9^{9}}``.
_EXPONENT = re.compile(r"\^\s*(?:\{\s*)?(\d+(?:\s*\^\s*(?:\{\s*)?\d+)*)")
_FACTORIAL = re.compile(r"(?<!\d)(\d+)\s*\}?\s*!")
_DIGITS = re.compile(r"\d+")
_BIG = 10**18


def _number(digits: str) -> float:
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else math.inf


def _tower_value(numbers: list[str]) -> float:
    """``n0 ^ (n1 ^ (... ))``, exact up to 10**18, ``math.inf`` beyond."""
    value = _number(numbers[-1])
    for digits in reversed(numbers[:-1]):
        base = _number(digits)
        if value == 0:
            value = 1
        elif base <= 1:
            value = base
        elif math.isinf(value) or math.isinf(base) or value * math.log10(base) > 18:
            value = math.inf
        else:
            value = base**value
    return value if value <= _BIG else math.inf


def prescreen(answer: str) -> str | None:
    """Why the boxed ``answer`` is refused without running math-verify (``"length"``, ``"exponent"``,
    ``"factorial"``), or None when it is scored normally.

    Refused: more than ``MAX_ANSWER_CHARS`` characters (a degenerate loop inside the box); a power whose
    exponent is a number or a tower of numbers above ``MAX_EXPONENT`` (``9^{9^{9}}``, ``2^{10^{9}}``: sympy
    evaluates them exactly, for minutes); a factorial of a number above ``MAX_FACTORIAL``. Linear in the
    answer. The time bound does not rely on this: it only saves the bound's wait (or a restart) per such
    answer.
    """
    if len(answer) > MAX_ANSWER_CHARS:
        return "length"
    for m in _EXPONENT.finditer(answer):
        if _tower_value(_DIGITS.findall(m.group(1))) > MAX_EXPONENT:
            return "exponent"
    for m in _FACTORIAL.finditer(answer):
        if _number(m.group(1)) > MAX_FACTORIAL:
            return "factorial"
    return None


@lru_cache(maxsize=65536)
def _parse_gold(solution: str) -> str:
    """The LaTeX math-verify parses for a gold solution: a full worked solution is reduced to its last boxed
    answer, a bare answer is boxed. (The parse itself runs, cached, in the worker.)"""
    boxed = last_boxed(solution)
    return _BOXED + (solution if boxed is None else boxed) + "}"


class _ResultCache:
    """Scores of ``(gold_latex, pred_latex)`` pairs already verified (math-verify is deterministic); timeouts
    are not cached."""

    def __init__(self, size: int):
        self._size, self._data, self._lock = size, {}, threading.Lock()

    def get(self, key):
        with self._lock:
            return self._data.get(key)

    def put(self, key, value: float) -> None:
        with self._lock:
            if len(self._data) >= self._size:
                self._data.pop(next(iter(self._data)))
            self._data[key] = value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


_RESULTS = _ResultCache(_RESULT_CACHE_SIZE)


def _score(completions, solution, *, timeout: float, screen: bool, name: str, log_metric) -> list[float]:
    if len(completions) != len(solution):
        raise ValueError(f"{name} got {len(completions)} completions but {len(solution)} solutions")
    scores = [0.0] * len(completions)
    refused: list[int] = []
    pending: dict[tuple[str, str], list[int]] = {}
    answer_chars: dict[int, int] = {}
    for i, (completion, gold) in enumerate(zip(completions, solution, strict=True)):
        answer = last_boxed(completion_text(completion))
        if answer is None or not answer.strip():
            continue  # no \boxed{}: math-verify would fall back to the last number, which we do not reward
        answer_chars[i] = len(answer)
        if screen and prescreen(answer) is not None:
            refused.append(i)
            continue
        key = (_parse_gold(str(gold)), _BOXED + answer + "}")
        cached = _RESULTS.get(key)
        if cached is not None:
            scores[i] = cached
        else:
            pending.setdefault(key, []).append(i)
    timed_out: list[int] = []
    if pending:
        keys = list(pending)
        for key, value in zip(keys, verify_pairs(keys, timeout), strict=True):
            if value is None:
                timed_out.extend(pending[key])
                continue
            _RESULTS.put(key, value)
            for i in pending[key]:
                scores[i] = value
    if log_metric is not None:
        log_metric(f"{name}/timeouts", float(len(refused) + len(timed_out)))
        log_metric(f"{name}/timeouts_prescreened", float(len(refused)))
    if refused or timed_out:
        lengths = sorted(answer_chars[i] for i in refused + timed_out)
        shown = lengths if len(lengths) <= 8 else f"{lengths[0]}..{lengths[-1]}"
        logger.warning(
            "%s: %d of %d completions scored 0 by the %.3g s time bound (%d refused by the pre-screen, %d "
            "timed out); boxed answer lengths %s characters", name, len(refused) + len(timed_out),
            len(completions), timeout, len(refused), len(timed_out), shown,
        )
    return scores


def accuracy_reward(completions, solution, **kwargs) -> list[float]:
    """1.0 when the last ``\\boxed{}`` answer of a completion equals the gold ``solution`` (math-verify), else 0.0.

    ``solution`` is the dataset's gold column: a bare answer (``"52"``) or LaTeX containing ``\\boxed{}``.
    Each completion is bounded by ``REWARD_TIMEOUT_SECONDS`` (:func:`make_accuracy_reward` for another bound).
    """
    return _score(completions, solution, timeout=REWARD_TIMEOUT_SECONDS, screen=True, name="accuracy_reward",
                  log_metric=kwargs.get("log_metric"))


class AccuracyReward:
    """:func:`accuracy_reward` with its own per-completion time bound, as a picklable TRL reward function (a
    ``__name__``, plain-data state). Build it with :func:`make_accuracy_reward`."""

    def __init__(self, timeout_seconds: float | None = None, prescreen: bool = True,
                 name: str = "accuracy_reward"):
        if timeout_seconds is not None and not (0 < timeout_seconds < math.inf):
            raise ValueError(f"timeout_seconds must be a positive number of seconds, got {timeout_seconds!r}")
        self.timeout_seconds = None if timeout_seconds is None else float(timeout_seconds)
        self.prescreen = bool(prescreen)
        self.__name__ = name

    def __call__(self, completions, solution, **kwargs) -> list[float]:
        timeout = REWARD_TIMEOUT_SECONDS if self.timeout_seconds is None else self.timeout_seconds
        return _score(completions, solution, timeout=timeout, screen=self.prescreen, name=self.__name__,
                      log_metric=kwargs.get("log_metric"))

    def __repr__(self) -> str:
        return (f"AccuracyReward(timeout_seconds={self.timeout_seconds}, prescreen={self.prescreen}, "
                f"name={self.__name__!r})")


def make_accuracy_reward(timeout_seconds: float | None = None, *, prescreen: bool = True,
                         name: str = "accuracy_reward") -> AccuracyReward:
    """The accuracy reward with a per-completion time bound of ``timeout_seconds`` seconds (None:
    ``REWARD_TIMEOUT_SECONDS``).

    ``prescreen=False`` sends every answer to math-verify (the bound still holds; pathological answers then
    cost up to the bound each). ``name`` is the reward's name in TRL's logs and the prefix of its timeout
    metrics.
    """
    return AccuracyReward(timeout_seconds, prescreen, name)


# Closing math delimiters allowed after the box: ``$\\boxed{7}$``, ``\\[ \\boxed{7} \\]``.
_MATH_CLOSERS = ("$$", "$", "\\]", "\\)")


def _well_formatted(text: str) -> bool:
    """``text`` ends with its only ``\\boxed{...}``, balanced and not blank (see :func:`format_reward`).
    Linear in the text."""
    text = text.strip()
    for closer in _MATH_CLOSERS:
        if text.endswith(closer):
            text = text[: -len(closer)].rstrip()
            break
    start = text.find("\\boxed")
    if start < 0 or text.find("\\boxed", start + 1) >= 0 or not text.startswith(_BOXED, start):
        return False
    depth = 0
    for m in _BRACE.finditer(text, start + len(_BOXED) - 1):
        depth += 1 if m.group() == "{" else -1
        if depth == 0:  # the box closes here: it must end the text and hold an answer
            return m.end() == len(text) and bool(text[start + len(_BOXED) : m.start()].strip())
    return False


def format_reward(completions, **kwargs) -> list[float]:
    """1.0 when a completion ends with exactly one ``\\boxed{...}`` answer (reasoning before it), else 0.0.

    The answer may be any LaTeX with balanced braces (``\\boxed{\\frac{1}{2}}``), the reasoning any text or LaTeX
    (``\\frac{a}{b}``), and the box may be closed by a math delimiter (``$``, ``$$``, ``\\]``, ``\\)``). Scores 0:
    no box, a second ``\\boxed``, anything else after the box, an unbalanced box, a blank answer.
    """
    return [1.0 if _well_formatted(completion_text(c)) else 0.0 for c in completions]


REWARD_FUNCS = {"accuracy_reward": accuracy_reward, "format_reward": format_reward}
