"""``report_to=["trackio"]``: every trainer trains with trackio, and the offline pass's numbers
reach it once it starts. The pass runs in ``__init__``, before transformers starts any tracker; TRL's profiling
reported its scoring forwards to trackio there and crashed ERPO and DPH-RL ("Call trackio.init() before
trackio.log()"). Local and offline: trackio writes an SQLite database under a temporary directory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

trackio = pytest.importorskip("trackio", reason="trackio is not installed (pip install trackio)")

from .helpers import TRAINERS, small_trainer  # noqa: E402

PROJECT = "trl-variants-tests"


@pytest.fixture
def trackio_dir(tmp_path, monkeypatch):
    """trackio reads ``TRACKIO_DIR`` when it is imported (TRL imports it with ``trl``, before any test runs), and its
    modules keep their own copies of the path: point every copy at a temporary directory."""
    root = tmp_path / "trackio"
    paths = {"TRACKIO_DIR": root, "MEDIA_DIR": root / "media", "ARTIFACTS_DIR": root / "artifacts"}
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "trackio" and module is not None:
            for attr, path in paths.items():
                if isinstance(getattr(module, attr, None), Path):
                    monkeypatch.setattr(module, attr, path)
    monkeypatch.setenv("TRACKIO_DIR", str(root))
    return root


def _recorded(run: str) -> list[dict]:
    from trackio.sqlite_storage import SQLiteStorage

    return SQLiteStorage.get_logs(PROJECT, run)


@pytest.mark.parametrize("method", list(TRAINERS))
def test_trains_with_trackio_and_records_the_offline_pass(method, tmp_path, trackio_dir):
    overrides = {"entropy_gate": "always"} if method == "eepo" else {}
    trainer = small_trainer(method, tmp_path, report_to=["trackio"], project=PROJECT, run_name=method, max_steps=2,
                            max_completion_length=8, **overrides)
    # local by default on every transformers (before 5.8 its default was the public Space "trackio"; the whole suite
    # under transformers 5.0 failed here, unable to deploy it offline)
    assert trainer.args.trackio_space_id is None
    trainer.train()
    assert trainer.state.global_step == 2
    logs = _recorded(method)
    assert (trackio_dir / f"{PROJECT}.db").exists() and logs
    steps = {row.get("train/global_step") for row in logs}
    assert {1, 2} <= steps  # both steps reached the tracker
    offline = {k: v for row in logs for k, v in row.items() if k.startswith("train/offline_pass/")}
    if method == "eepo":  # no offline pass; its own metrics reach trackio
        assert not offline and any("train/eepo/entropy_stage1" in row for row in logs)
        return
    # the offline pass's numbers, exactly as the trainer holds them, once, with the first log
    assert [row["train/global_step"] for row in logs if "train/offline_pass/seconds" in row] == [1]
    assert offline["train/offline_pass/seconds"] > 0
    if method == "erpo":
        ref = trainer.train_dataset["ref_prompt_logp"]
        assert offline["train/offline_pass/num_prompts"] == len(ref) == 16
        assert offline["train/offline_pass/ref_prompt_logp_mean"] == pytest.approx(sum(ref) / len(ref))
    elif method == "dph":
        for key, value in trainer.split_stats.items():
            assert offline[f"train/offline_pass/{key}"] == value
        assert offline["train/offline_pass/num_exp_prompts"] == len(trainer.train_dataset)
        assert 0 <= offline["train/offline_pass/mean_reward"] <= 1
    else:
        assert offline["train/offline_pass/num_prompts_kept"] == len(trainer.train_dataset) == 16
        assert offline["train/offline_pass/mean_value"] == pytest.approx(
            sum(trainer.train_dataset["ref_value"]) / 16)
    # the same numbers in the trainer's own log history (what every other tracker receives)
    first = trainer.state.log_history[0]
    assert {f"train/{k}": v for k, v in first.items() if k.startswith("offline_pass/")} == pytest.approx(offline)
