"""Under real DeepSpeed ZeRO-3 (one CPU process, ``accelerate launch`` with configs/accelerate/zero3.yaml): DPH-RL on
LoRA adapters with gradient checkpointing, where TRL sets reentrant checkpointing, is refused in ``__init__``,
before its offline pass. Two processes made DeepSpeed fail in the first backward with a bare AssertionError (D_pef's
forward is a second forward through the same weights; results/distributed/backends.md, docs/distributed.md)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_dph_on_lora_with_reentrant_checkpointing_is_refused_under_zero3_before_the_offline_pass(tmp_path):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install 'trl-variants[deepspeed]')")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HARNESS_DTYPE="float32")
    accelerate = Path(sys.executable).parent / "accelerate"
    proc = subprocess.run([str(accelerate), "launch", "--config_file", str(ROOT / "configs/accelerate/zero3.yaml"),
                           "--num_processes", "1", "--mixed_precision", "no", "--main_process_port", "29651",
                           str(ROOT / "trainers_tests/distributed/harness.py"), "dph_peft", str(tmp_path / "run")],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert ("ValueError: DPHTrainer: part 'dph_rehearsal' runs a forward with gradient of its own before the step's "
            "one backward, and this run uses DeepSpeed ZeRO-3 with reentrant gradient checkpointing") in out, out[-3000:]
    assert "gradient_checkpointing=False" in out and "zero2.yaml" in out
    assert "presample" not in out  # refused before the offline pass sampled anything
