"""The example scripts as users run them: `accelerate launch`, YAML defaults, flags overriding them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ACCELERATE = Path(sys.executable).parent / "accelerate"
QUICK = ["--max_steps", "2", "--embedded_train_size", "64", "--per_device_train_batch_size", "16",
         "--num_generations", "4", "--max_completion_length", "24", "--torch_threads", "1", "--logging_steps", "1",
         "--embedded_test_size", "16"]


def _run(args, tmp_path, timeout=400):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               TRL_VARIANTS_CACHE=str(tmp_path / "cache"))
    return subprocess.run([str(ACCELERATE), "launch", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["erpo", "eepo", "dph", "apo", "grpo"])
def test_example_runs_offline_with_yaml_defaults(tmp_path, algo):
    extra = {"dph": ["--num_presamples", "4", "--pef_threshold", "4", "--pef_batch_size", "2"],
             "apo": ["--num_generations", "1", "--num_value_samples", "4"]}.get(algo, [])
    quick = QUICK if algo != "apo" else [a for a in QUICK if a not in ("--num_generations", "4")]
    proc = _run(["--num_processes", "1", "--mixed_precision", "no", f"examples/train_{algo}.py", *quick, *extra,
                 "--output_dir", str(tmp_path / "out")], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained on 1 process(es)" in proc.stdout
    assert (tmp_path / "out" / "model.safetensors").exists() and (tmp_path / "out" / "README.md").exists()
    card = (tmp_path / "out" / "README.md").read_text()
    if algo != "grpo":  # TRL's GRPOTrainer writes its own card
        assert "## Training command" in card and f"python examples/train_{algo}.py " in card
        assert "--output_dir out" in card and str(tmp_path) not in card  # a local path by its last part
    if algo in ("erpo", "grpo"):  # the main job and its baseline end with held-out accuracy, base vs trained
        assert "held-out accuracy on 16 prompts never trained on (base -> step 2):" in proc.stdout
        record = json.loads((tmp_path / "out" / "heldout.json").read_text())
        assert [h["step"] for h in record["history"]] == [0, 2] and record["num_prompts"] == 16
        assert (tmp_path / "out" / "heldout_curves.png").stat().st_size > 10_000


def test_grpo_baseline_config_is_the_main_jobs_setup():
    """`examples/train_grpo.py` is TRL's GRPOTrainer on exactly the main job's setup: every field the two tiny
    configs share has the same value, and the only ERPO-only fields are ERPO's additions."""
    erpo = yaml.safe_load((ROOT / "configs" / "erpo" / "tiny_cpu.yaml").read_text())
    grpo = yaml.safe_load((ROOT / "configs" / "grpo" / "tiny_cpu.yaml").read_text())
    assert set(erpo) - set(grpo) == {"use_query_weights", "query_weight_source", "query_kl_coef",
                                     "query_kl_estimator"}
    assert set(grpo) <= set(erpo)
    assert {k: v for k, v in grpo.items() if k != "output_dir"} == {k: erpo[k] for k in grpo if k != "output_dir"}


@pytest.mark.slow
def test_multi_cpu_config_really_starts_two_ranks(tmp_path):
    proc = _run(["--config_file", "configs/accelerate/multi_cpu.yaml", "--main_process_port", "29541",
                 "examples/train_erpo.py", *QUICK, "--output_dir", str(tmp_path / "out")], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained on 2 process(es)" in proc.stdout
