"""The numbers of an evaluation: which reward function decides correctness, pass@k (unbiased estimator), avg@k,
keep / exploration rates against a base model, and the aggregation of chunk records into a result."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from ..presample.reward_calls import RewardModelReward, reward_name
from .config import EvalConfig

DEFAULT_CORRECTNESS = "accuracy_reward"
"""The reward function whose value > 0 counts a sample as correct when none is named (the recipes train with it)."""


def correctness_index(reward_funcs: Sequence[Callable], correctness_func=None) -> int:
    """Which of ``reward_funcs`` decides correctness (a sample is correct when its value is > 0; the others are only
    reported): ``correctness_func`` (one of the functions, or its name), else the one named ``accuracy_reward``,
    else the only function. A reward model is never chosen unless named. Raises, naming the functions, when the
    choice is missing or ambiguous."""
    names = [reward_name(f) for f in reward_funcs]
    if correctness_func is not None and not isinstance(correctness_func, str):
        found = [i for i, f in enumerate(reward_funcs) if f is correctness_func]
        if not found:
            raise ValueError(f"correctness_func {reward_name(correctness_func)!r} is not one of the reward functions "
                             f"{names}: pass it in reward_funcs too")
        return found[0]
    if correctness_func is not None:
        if correctness_func not in names:
            raise ValueError(f"correctness_func {correctness_func!r} names none of the reward functions {names}: "
                             "name one of them, or add that function to reward_funcs")
        return names.index(correctness_func)
    if DEFAULT_CORRECTNESS in names:
        return names.index(DEFAULT_CORRECTNESS)
    if len(reward_funcs) == 1 and not isinstance(reward_funcs[0], RewardModelReward | torch.nn.Module):
        return 0
    if len(reward_funcs) == 1:
        raise ValueError(f"the only reward is the reward model {names[0]!r}, and its score > 0 does not mean a "
                         "correct answer: add a verifiable reward function (accuracy_reward) to decide correctness, "
                         "or count score > 0 as correct explicitly with correctness_func (--correctness_func "
                         "reward_model)")
    raise ValueError(f"evaluate counts a sample correct from one reward function, and none of {names} is "
                     f"{DEFAULT_CORRECTNESS}: name the one whose value > 0 means correct with correctness_func "
                     "(--correctness_func NAME); the others are reported beside it, never summed into correctness")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al. 2021) from ``n`` samples with ``c`` correct, in its numerically stable
    product form ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def ks_up_to(k: int) -> list[int]:
    """1, 2, 4, ... up to k, and k itself."""
    out, v = [], 1
    while v < k:
        out.append(v)
        v *= 2
    return out + [k]


def keep_and_exploration_rates(base_solved: Sequence[bool], new_solved: Sequence[bool]) -> dict[str, float]:
    """DPH-RL Sec. 6.1: of the prompts the base model solved (any of its k samples correct), the fraction the new
    model still solves (keep rate); of those it did not, the fraction the new model now solves (exploration rate)."""
    if len(base_solved) != len(new_solved):
        raise ValueError(f"base has {len(base_solved)} prompts, new has {len(new_solved)}: evaluate the same prompts")
    kept = [n for b, n in zip(base_solved, new_solved, strict=True) if b]
    found = [n for b, n in zip(base_solved, new_solved, strict=True) if not b]
    return {"keep_rate": sum(kept) / len(kept) if kept else float("nan"),
            "exploration_rate": sum(found) / len(found) if found else float("nan"),
            "num_base_solved": len(kept), "num_base_unsolved": len(found)}


def pass_extras(chunks: list[dict], reward_labels: list[str], samples_per_prompt: int) -> dict:
    """A pass's mean value of each reward function (over the samples it scored) and the share of samples that
    stopped at max_completion_length, from its chunk records; a number is left out when a chunk read back from a
    file written by an earlier version lacks it."""
    extras: dict = {}
    if all("reward_sums" in r for r in chunks):
        sums = [math.fsum(r["reward_sums"][j] for r in chunks) for j in range(len(reward_labels))]
        counts = [sum(r["reward_counts"][j] for r in chunks) for j in range(len(reward_labels))]
        extras["reward_means"] = {name: s / c if c else float("nan")
                                  for name, s, c in zip(reward_labels, sums, counts, strict=True)}
    if all("stopped_at_limit" in r for r in chunks):
        samples = samples_per_prompt * sum(len(r["correct"]) for r in chunks)
        extras["stopped_at_limit"] = sum(r["stopped_at_limit"] for r in chunks) / samples
    return extras


def reward_labels(reward_funcs) -> list[str]:
    """The reward functions' names as the results name them (a repeated name gets ``#2``, ``#3``...)."""
    names = [reward_name(f) for f in reward_funcs]
    return [n if names[:i].count(n) == 0 else f"{n}#{names[:i].count(n) + 1}" for i, n in enumerate(names)]


def aggregate(records: dict, passes, n_chunks: int, config: EvalConfig, dataset, with_entropy: bool,
               with_kl: bool, base_results: dict | None, labels: list[str] | None = None) -> dict:
    """The numbers of every pass, from the chunk records in chunk order (the same sums whether the records were
    computed now or read back)."""
    out: dict = {"temperatures": {}}
    n = config.k
    for label, temperature in passes:
        chunks = [records[(label, c)] for c in range(n_chunks)]
        correct = [c for r in chunks for c in r["correct"]]
        extras = pass_extras(chunks, labels or [], 1 if temperature is None else n)
        if temperature is None:
            out["greedy"] = sum(c > 0 for c in correct) / len(correct)
            out.update({f"greedy_{k}": v for k, v in extras.items()})
            continue
        entry = {
            f"avg@{n}": sum(correct) / (n * len(correct)),
            "pass@k": {str(kk): sum(pass_at_k(n, c, kk) for c in correct) / len(correct) for kk in ks_up_to(n)},
            "mean_length": sum(r["length_sum"] for r in chunks) / (n * len(correct)),
            "correct": correct,
            **extras,
        }
        if "level" in dataset.column_names:
            levels = dataset["level"]
            entry["avg_by_level"] = {str(lv): sum(c for c, l_ in zip(correct, levels, strict=True) if l_ == lv)
                                     / (n * sum(1 for l_ in levels if l_ == lv)) for lv in sorted(set(levels))}
        if with_entropy:
            entry["entropy"] = sum(r["entropy_sum"] for r in chunks) / max(sum(r["entropy_tokens"] for r in chunks), 1)
        if with_kl:  # MC estimate of KL(pi || pi_ref) per sequence
            entry["kl_to_reference"] = sum(r["kl_sum"] for r in chunks) / max(sum(r["kl_sequences"] for r in chunks), 1)
        if base_results is not None:
            base = base_results["temperatures"].get(label)
            if base is None:
                raise ValueError(f"base_results has no temperature {label}: evaluate the base at the same temperatures")
            entry.update(keep_and_exploration_rates([c > 0 for c in base["correct"]], [c > 0 for c in correct]))
        out["temperatures"][label] = entry
    return out
