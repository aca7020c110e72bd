"""benchmarks/probe_beyond_levels.py: the per-level numbers, by hand (the probe itself needs the hard-split study's
models, so it is not run here)."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "probe_beyond_levels.py"


def _probe():
    spec = importlib.util.spec_from_file_location("probe_beyond_levels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_by_level_hand_computed():
    # level 5: prompts solved 0, 3, 1 times of 4 -> pass@4 2/3, success rate 4/12; level 6: 0 of 4 -> 0, 0
    got = _probe().by_level([5, 5, 5, 6], [0, 3, 1, 0], k=4)
    assert got["5"] == {"prompts": 3, "pass@4": pytest.approx(2 / 3), "success_rate": pytest.approx(4 / 12)}
    assert got["6"] == {"prompts": 1, "pass@4": 0.0, "success_rate": 0.0}


def test_missing_study_is_named(tmp_path):
    with pytest.raises(SystemExit, match="hard-split study"):
        _probe().main(["--work_dir", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")])
