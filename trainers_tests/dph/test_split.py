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
