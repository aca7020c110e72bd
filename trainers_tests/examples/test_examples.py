"""The example scripts as users run them: `accelerate launch`, YAML defaults, flags overriding them."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ACCELERATE = Path(sys.executable).parent / "accelerate"
QUICK = ["--max_steps", "2", "--embedded_train_size", "64", "--per_device_train_batch_size", "16",
         "--num_generations", "4", "--max_completion_length", "24", "--torch_threads", "1", "--logging_steps", "1"]


def _run(args, tmp_path, timeout=400):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               TRL_VARIANTS_CACHE=str(tmp_path / "cache"))
    return subprocess.run([str(ACCELERATE), "launch", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["erpo", "eepo", "dph", "apo"])
def test_example_runs_offline_with_yaml_defaults(tmp_path, algo):
    extra = {"dph": ["--num_presamples", "4", "--pef_threshold", "4", "--pef_batch_size", "2"],
             "apo": ["--num_generations", "1", "--num_value_samples", "4"]}.get(algo, [])
    quick = QUICK if algo != "apo" else [a for a in QUICK if a not in ("--num_generations", "4")]
    proc = _run(["--num_processes", "1", "--mixed_precision", "no", f"examples/train_{algo}.py", *quick, *extra,
                 "--output_dir", str(tmp_path / "out")], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained on 1 process(es)" in proc.stdout
    assert (tmp_path / "out" / "model.safetensors").exists() and (tmp_path / "out" / "README.md").exists()


@pytest.mark.slow
def test_multi_cpu_config_really_starts_two_ranks(tmp_path):
    proc = _run(["--config_file", "configs/accelerate/multi_cpu.yaml", "--main_process_port", "29541",
                 "examples/train_erpo.py", *QUICK, "--output_dir", str(tmp_path / "out")], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained on 2 process(es)" in proc.stdout
