from pathlib import Path

import pytest
from datasets import Dataset

from trl_variants.dph.split import dph_split


def test_dph_split_hand_built():
    ds = Dataset.from_dict({
        "prompt": ["a", "b", "c"],
        "ref_prompt_ids": [[1, 2], [3, 4], [5, 6]],
        "ref_rewards": [[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0]],
        "ref_completion_ids": [[[7], [8], [9]], [[10], [11], [12]], [[13], [14], [15]]],
        "ref_completion_logps": [[[-0.1], [-0.2], [-0.3]], [[-1.0], [-1.1], [-1.2]], [[-2.0], [-2.1], [-2.2]]],
    })
    all_of = dph_split(ds, threshold=3)
    assert all_of.pef["completion_ids"] == [[7], [8], [9]] and all_of.pef["prompt_index"] == [0, 0, 0]
    assert all_of.exp["prompt"] == ["b", "c"] and all_of.exp.column_names == ["prompt"]
    two_of = dph_split(ds, threshold=2, keep="one")
    assert two_of.pef["completion_ids"] == [[7], [10]] and two_of.pef["completion_logps"] == [[-0.1], [-1.0]]
    assert two_of.exp["prompt"] == ["c"]
    refined = dph_split(ds, threshold=2, refine_rewards=[1.0, 0.0, 1.0])
    assert refined.pef["prompt_index"] == [0, 0, 0] and refined.exp["prompt"] == ["b", "c"]
    assert refined.stats["moved_by_refinement"] == 1
    with pytest.raises(ValueError, match="threshold"):
        dph_split(ds, threshold=4)


def test_dph_split_drops_unsolved_prompts():
    """App. G.1's Pass@k = 0 filter: 5 prompts with 4, 2, 0, 1 and 0 of 4 correct (a NaN reward is never correct).
    Threshold 3: D_pef = {a}; D_exp = {b, d} with the filter (c and e dropped), {b, c, d, e} without it."""
    nan = float("nan")
    rewards = [[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0],
               [nan, 0.0, nan, 0.5]]
    ds = Dataset.from_dict({
        "prompt": ["a", "b", "c", "d", "e"],
        "ref_prompt_ids": [[i] for i in range(5)],
        "ref_rewards": rewards,
        "ref_completion_ids": [[[10 * i + j] for j in range(4)] for i in range(5)],
        "ref_completion_logps": [[[-0.1 * j] for j in range(4)] for _ in range(5)],
    })
    kept = dph_split(ds, threshold=3)
    assert kept.exp["prompt"] == ["b", "c", "d", "e"] and kept.stats["num_unsolved_dropped"] == 0
    dropped = dph_split(ds, threshold=3, drop_unsolved=True)
    assert dropped.exp["prompt"] == ["b", "d"] and dropped.pef["completion_ids"] == [[0], [1], [2], [3]]
    assert dropped.stats == {"num_prompts": 5, "num_pef_prompts": 1, "num_unsolved_dropped": 2, "num_pef_rows": 4,
                             "num_exp_prompts": 2, "moved_by_refinement": 0}
    # refinement moves a D_pef prompt to D_exp, never out: a solved prompt is not "unsolved"
    refined = dph_split(ds, threshold=3, refine_rewards=[0.0] * 5, drop_unsolved=True)
    assert refined.exp["prompt"] == ["a", "b", "d"] and len(refined.pef) == 0
    assert refined.stats["num_pef_prompts"] == 0 and refined.stats["moved_by_refinement"] == 1


def test_dph_config_drop_unsolved_default_off():
    """Off by default (a trainer keeps the train_dataset it is given); the paper recipe turns it on."""
    import dataclasses

    import yaml

    from trl_variants import DPHConfig

    assert {f.name: f.default for f in dataclasses.fields(DPHConfig)}["drop_unsolved"] is False
    recipe = Path(__file__).resolve().parents[2] / "configs" / "dph" / "qwen2.5-math-7b.yaml"
    assert yaml.safe_load(recipe.read_text())["drop_unsolved"] is True
