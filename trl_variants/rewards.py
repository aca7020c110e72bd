"""Reward functions with TRL's reward signature: ``f(prompts, completions, **dataset_columns) -> list[float]``.

Completions may be plain strings or conversational (``[{"role": "assistant", "content": ...}]``), as GRPOTrainer
passes them. Neither function ever raises on malformed model output: such output scores 0.0.
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache

from math_verify import parse, verify

__all__ = ["accuracy_reward", "format_reward", "last_boxed", "completion_text", "REWARD_FUNCS"]

_BOXED = "\\boxed{"


def completion_text(completion) -> str:
    """The text of one completion, plain or conversational (last message's content)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content", "")
        return content if isinstance(content, str) else ""
    return ""


def last_boxed(text: str) -> str | None:
    """Content of the last balanced ``\\boxed{...}`` in ``text``, or None when there is none."""
    start = text.rfind(_BOXED)
    while start != -1:
        depth, i = 1, start + len(_BOXED)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start + len(_BOXED) : i - 1]
        start = text.rfind(_BOXED, 0, start)  # unbalanced: try an earlier one
    return None


def _timeouts():
    # math-verify's timeouts use signal.alarm, which only works in the main thread.
    return 5 if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=65536)
def _parse_gold(solution: str):
    boxed = last_boxed(solution)  # a full worked solution: its last \boxed{} is the answer
    return parse(_BOXED + (solution if boxed is None else boxed) + "}", parsing_timeout=_timeouts())


def _is_correct(text: str, solution: str) -> float:
    answer = last_boxed(text)
    if answer is None or not answer.strip():
        return 0.0  # no \boxed{}: math-verify would fall back to the last number, which we do not reward
    try:
        gold = _parse_gold(str(solution))
        pred = parse(_BOXED + answer + "}", parsing_timeout=_timeouts())
        return float(bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=_timeouts()))
    except Exception:  # noqa: BLE001 - a reward never crashes training on malformed output
        return 0.0


def accuracy_reward(completions, solution, **kwargs) -> list[float]:
    """1.0 when the last ``\\boxed{}`` answer of a completion equals the gold ``solution`` (math-verify), else 0.0.

    ``solution`` is the dataset's gold column: a bare answer (``"52"``) or LaTeX containing ``\\boxed{}``.
    """
    if len(completions) != len(solution):
        raise ValueError(f"accuracy_reward got {len(completions)} completions but {len(solution)} solutions")
    return [_is_correct(completion_text(c), s) for c, s in zip(completions, solution, strict=True)]


_FORMAT = re.compile(r"^[^\\]*\\boxed\{[^{}]+\}\s*$", re.DOTALL)


def format_reward(completions, **kwargs) -> list[float]:
    """1.0 when a completion ends with exactly one ``\\boxed{...}`` answer (reasoning before it), else 0.0."""
    return [1.0 if _FORMAT.match(completion_text(c).strip()) else 0.0 for c in completions]


REWARD_FUNCS = {"accuracy_reward": accuracy_reward, "format_reward": format_reward}
