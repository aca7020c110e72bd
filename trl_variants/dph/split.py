"""DPH-RL's part of the offline pass: split the presampled prompts into near-perfect rehearsal rows (D_pef) and the
exploration set (D_exp), Sec. 4.1."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..presample.config import COLUMNS


@dataclass
class DPHSplit:
    """Result of :func:`dph_split`: the near-perfect rehearsal rows and the exploration prompts."""

    pef: object  # datasets.Dataset: prompt_ids, completion_ids, completion_logps (one row per kept completion)
    exp: object  # datasets.Dataset: the exploration prompts (original columns)
    stats: dict = field(default_factory=dict)


def dph_split(dataset, threshold: int, keep: str = "all", refine_rewards: Sequence[float] | None = None, *,
              reward_index: int | None = None, correct_threshold: float = 1.0,
              drop_unsolved: bool = False) -> DPHSplit:
    """DPH-RL Sec. 4.1: prompts with at least ``threshold`` correct samples (of k) form D_pef, the rest D_exp.

    Args:
        dataset: a presampled dataset with ``ref_rewards``, ``ref_completion_ids``, ``ref_completion_logps``.
        threshold: the "t of k" rule (paper recommends k of k).
        keep: ``"all"`` correct completions of a D_pef prompt become rehearsal rows, or ``"one"`` (the first).
        refine_rewards: optional, one extra sample's reward per prompt (the refinement draw, the same reward as
            decides correctness): a D_pef prompt whose extra sample is wrong moves to D_exp.
        reward_index: which reward function decides correctness: its column in ``ref_rewards_per_func``; None =
            the weighted sum ``ref_rewards``.
        correct_threshold: a sample is correct when that reward is at least this (paper: accuracy reward = 1). NaN
            (no reward) is never correct.
        drop_unsolved: drop the prompts with no correct sample of k from both sets (App. G.1: "filtered out
            problems that initially had a Pass@8 score of 0").
    Returns:
        :class:`DPHSplit` with ``pef`` rows (``prompt_ids``, ``completion_ids``, ``completion_logps``, ``prompt_index``)
        and ``exp`` = the D_exp rows of ``dataset`` without the presample columns; ``stats`` counts both and the
        prompts dropped as unsolved (``num_unsolved_dropped``).
    """
    from datasets import Dataset

    needed = ("ref_rewards" if reward_index is None else "ref_rewards_per_func", "ref_completion_ids",
              "ref_completion_logps", "ref_prompt_ids")
    missing = [c for c in needed if c not in dataset.column_names]
    if missing:
        raise ValueError(f"dph_split needs a presampled dataset with {missing} (presample with "
                         "record_completion_logps=True)")
    if keep not in ("all", "one"):
        raise ValueError(f"keep must be 'all' or 'one', got {keep!r}")
    k = len(dataset[0]["ref_rewards"])
    if not 1 <= threshold <= k:
        raise ValueError(f"threshold must be between 1 and k={k} (samples per prompt), got {threshold}")
    if refine_rewards is not None and len(refine_rewards) != len(dataset):
        raise ValueError(f"refine_rewards has {len(refine_rewards)} values for {len(dataset)} prompts")
    if reward_index is None:
        decisive = dataset["ref_rewards"]
    else:
        decisive = [[per_func[reward_index] for per_func in row] for row in dataset["ref_rewards_per_func"]]
    pef_rows = {"prompt_index": [], "prompt_ids": [], "completion_ids": [], "completion_logps": []}
    exp_index, moved, dropped = [], 0, 0
    for i, (rewards, comps, logps, p_ids) in enumerate(zip(
            decisive, dataset["ref_completion_ids"], dataset["ref_completion_logps"], dataset["ref_prompt_ids"],
            strict=True)):
        correct = [j for j, r in enumerate(rewards) if r >= correct_threshold]  # False for NaN
        if drop_unsolved and not correct:
            dropped += 1
            continue
        near_perfect = len(correct) >= threshold
        if near_perfect and refine_rewards is not None and not refine_rewards[i] >= correct_threshold:
            near_perfect, moved = False, moved + 1
        if not near_perfect:
            exp_index.append(i)
            continue
        for j in correct[:1] if keep == "one" else correct:
            pef_rows["prompt_index"].append(i)
            pef_rows["prompt_ids"].append(p_ids)
            pef_rows["completion_ids"].append(comps[j])
            pef_rows["completion_logps"].append(logps[j])
    extra = [c for c in COLUMNS if c in dataset.column_names]
    exp = dataset.select(exp_index).remove_columns(extra)
    num_pef = len(dataset) - len(exp_index) - dropped
    stats = {"num_prompts": len(dataset), "num_pef_prompts": num_pef, "num_unsolved_dropped": dropped,
             "num_pef_rows": len(pef_rows["prompt_index"]), "num_exp_prompts": len(exp_index),
             "moved_by_refinement": moved}
    return DPHSplit(pef=Dataset.from_dict(pef_rows), exp=exp, stats=stats)
