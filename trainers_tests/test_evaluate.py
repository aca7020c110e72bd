import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trl_variants import ERPOConfig, ERPOTrainer, accuracy_reward
from trl_variants.default import DEFAULT_MODEL_PATH, load_default_dataset
from trl_variants.evaluate import (
    EvalConfig,
    PassAtKCallback,
    evaluate,
    keep_and_exploration_rates,
    pass_at_k,
    write_report,
)

from .helpers import small_config, train_dataset


@pytest.mark.parametrize("n,c,k", [(8, 0, 1), (8, 8, 8), (8, 3, 1), (8, 3, 2), (8, 3, 5), (8, 3, 6), (16, 5, 8),
                                   (4, 4, 4), (4, 0, 4), (100, 1, 50)])
def test_pass_at_k_equals_exact_combinatorics(n, c, k):
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_edges_and_errors():
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 8, 1) == 1.0 and pass_at_k(8, 1, 8) == 1.0
    assert pass_at_k(8, 2, 1) == pytest.approx(0.25)  # pass@1 = c / n
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_keep_and_exploration_rates_hand_built():
    base = [True, True, True, False, False, False, False]
    new = [True, False, True, True, False, False, False]
    r = keep_and_exploration_rates(base, new)
    assert r["keep_rate"] == pytest.approx(2 / 3) and r["exploration_rate"] == pytest.approx(1 / 4)
    assert (r["num_base_solved"], r["num_base_unsolved"]) == (3, 4)
    with pytest.raises(ValueError, match="same prompts"):
        keep_and_exploration_rates([True], [True, False])


def _fake(name, greedy, temps):
    return {"name": name, "greedy": greedy, "config": {"k": 4}, "num_prompts": 2, "temperatures": {
        str(t): {"avg@4": a, "pass@k": {"1": a, "2": min(1, a * 1.5), "4": min(1, a * 2)}, "mean_length": 10.0,
                 "entropy": 0.5, "correct": [1, 2]} for t, a in temps.items()}}


def test_report_files_created_and_non_empty(tmp_path):
    paths = write_report([_fake("a", 0.5, {0.5: 0.4, 1.0: 0.3}), _fake("b", 0.6, {0.5: 0.45, 1.0: 0.2})], tmp_path)
    for key in ("json", "markdown", "temperature_plot", "pass_at_k_plot"):
        assert Path(paths[key]).stat().st_size > 200, key
    assert Path(paths["temperature_plot"]).read_bytes()[:4] == b"\x89PNG"
    assert "| b | 1.0 | 0.600 | 0.200 |" in Path(paths["markdown"]).read_text()


def test_end_to_end_on_the_embedded_model(tmp_path):
    test = load_default_dataset(n_train=0, n_test=24)["test"]
    config = EvalConfig(k=4, temperatures=[0.5, 1.0], max_completion_length=48, seed=3)
    base = evaluate(DEFAULT_MODEL_PATH, None, test, accuracy_reward, config, name="base")
    again = evaluate(DEFAULT_MODEL_PATH, None, test, accuracy_reward, config, name="again", base_results=base,
                     reference_model=DEFAULT_MODEL_PATH)
    for res in (base, again):
        assert 0.0 < res["greedy"] < 1.0
        t1 = res["temperatures"]["1.0"]
        assert len(t1["correct"]) == 24 and set(t1["pass@k"]) == {"1", "2", "4"}
        assert t1["pass@k"]["1"] == pytest.approx(t1["avg@4"])  # pass@1 is the mean accuracy
        assert t1["pass@k"]["1"] <= t1["pass@k"]["2"] <= t1["pass@k"]["4"]
        assert t1["entropy"] > res["temperatures"]["0.5"]["entropy"] > 0  # higher temperature, flatter
        assert 10 < t1["mean_length"] <= 48
    # same seed, same model: identical samples, so the model keeps everything and the KL to itself is 0
    assert again["temperatures"]["1.0"]["correct"] == base["temperatures"]["1.0"]["correct"]
    assert again["temperatures"]["1.0"]["keep_rate"] == 1.0 and again["temperatures"]["1.0"]["exploration_rate"] == 0
    assert again["temperatures"]["1.0"]["kl_to_reference"] == pytest.approx(0.0, abs=1e-5)
    paths = write_report([base, again], tmp_path)
    saved = json.loads(Path(paths["json"]).read_text())
    assert saved[1]["temperatures"]["0.5"]["correct"] == again["temperatures"]["0.5"]["correct"]


def test_cli(tmp_path):
    out = tmp_path / "eval"
    cli = Path(sys.executable).parent / "trl-variants"
    proc = subprocess.run([str(cli), "evaluate", "--max_prompts", "12", "--k", "2", "--temperatures", "1.0",
                           "--max_completion_length", "40", "--output_dir", str(out), "--torch_threads", "1"],
                          env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {p.name for p in out.iterdir()} >= {"results.json", "results.md", "accuracy_vs_temperature.png",
                                                "pass_at_k.png"}


def test_training_callback_logs_metrics(tmp_path):
    trainer = ERPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward,
                          args=small_config(ERPOConfig, tmp_path, max_steps=2), train_dataset=train_dataset())
    test = load_default_dataset(n_train=0, n_test=8)["test"]
    trainer.add_callback(PassAtKCallback(trainer, test, EvalConfig(k=2, temperatures=[1.0], max_completion_length=32),
                                         eval_steps=2))
    trainer.train()
    logged = [h for h in trainer.state.log_history if "eval_passk/T1.0/pass@2" in h]
    assert len(logged) == 1 and 0 <= logged[0]["eval_passk/greedy"] <= 1
