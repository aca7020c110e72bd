"""`benchmarks/heldout_split.py`: the rule that chooses the hard held-out split from the base model's samples."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("heldout_split", ROOT / "benchmarks" / "heldout_split.py")
heldout_split = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(heldout_split)


def test_hard_prompts_are_those_the_base_solves_at_most_max_rate_of_the_time():
    rates = [0.0, 0.25, 0.26, 1.0, 0.1, 0.02]
    levels = [1, 2, 2, 3, 5, 4]
    assert heldout_split.hard_indices(rates, levels, 0.25, candidate_levels=[1, 2, 3, 4]) == [0, 1, 5]
    assert heldout_split.hard_indices(rates, levels, 0.25, candidate_levels=[1, 2, 3, 4, 5]) == [0, 1, 4, 5]


def test_pass_rates_by_level_by_hand():
    k = 64
    rows = heldout_split.level_rows([1, 1, 2], [0.5, 0.0, 1 / 64], ks=[1, 64], k=k)
    one, two = rows
    assert one == pytest.approx({"level": 1, "prompts": 2, "avg": 0.25, "pass@1": 0.25, "pass@64": 0.5})
    assert two == pytest.approx({"level": 2, "prompts": 1, "avg": 1 / 64, "pass@1": 1 / 64, "pass@64": 1.0})
