"""Under real FSDP2: torch's ``fully_shard`` over 2 gloo CPU processes, started by ``accelerate launch`` with
configs/accelerate/fsdp2.yaml. Accelerate 1.15 turns FSDP on only over GPU process groups; the harness lifts that one
gate on a machine without a GPU (``harness._fsdp_on_cpu``), so Accelerate's FSDP2 ``prepare`` (DTensor-sharded
parameters, its float32 upcast under mixed precision, its full state dict on save) and TRL's FSDP branches run.

1. DPH-RL (its offline pass in ``__init__`` on the model before FSDP shards it, and the D_pef forward: a second
   forward through the sharded weights before the step's one backward) and EEPO (its unlearning step on the shards:
   FSDP's own backward, the step on each shard, the full weights gathered again for stage 2) train on 2 FSDP2
   processes as on 1 process, within test_equivalence.py's tolerances: asserted in ``test_equivalence.py``'s DPH-RL
   and EEPO cases, which have the 1-process runs already (``launch_fsdp2`` below). EEPO's step also holds within
   gradient accumulation (below).
2. A policy loaded in bf16, with bf16 mixed precision set only by the launcher (the training config says
   ``bf16: false``; transformers turns it on from ``accelerate launch``): FSDP keeps float32 master weights, so the
   master-weights rule accepts it (it refused it before it read the launcher's mixed precision), and the weights are
   trained and saved in float32. The run checkpoints every step (FSDP's full state dict, AdamW's moments, the
   trainer's own state); a second launch resumed from step 2 ends with the same weights, bit for bit.
3. Under bf16 mixed precision the log-probs reach the losses in float32 (Accelerate's FSDP2 policy casts module
   outputs to bf16; the trainers set float32 outputs, ``_numerics.float32_outputs_under_fsdp``): EEPO's unlearning
   loss on bf16 log-probs was infinite and its first step made every weight NaN. With torch 2.11 (an H100, 2026-11-28)
   those float32 outputs reached the tied model's LM head uncast and every trainer failed its first rollout; the
   harness reproduces torch 2.11's grouped hooks on the suite's torch (``HARNESS_GROUPED_HOOKS``).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "trainers_tests" / "distributed" / "harness.py"


def launch_fsdp2(trainer: str, out: Path, port: int, mixed_precision: str = "no", dtype: str = "float64",
                 state_dict_type: str | None = None, **harness_env) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HARNESS_DTYPE=dtype, **harness_env)
    env.pop("ACCELERATE_USE_CPU", None)
    accelerate = Path(sys.executable).parent / "accelerate"
    proc = subprocess.run([str(accelerate), "launch", "--config_file", str(ROOT / "configs/accelerate/fsdp2.yaml"),
                           "--num_processes", "2", "--mixed_precision", mixed_precision, "--main_process_port",
                           str(port), *(["--fsdp_state_dict_type", state_dict_type] if state_dict_type else []),
                           str(HARNESS), trainer, str(out)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=out.parent)
    assert proc.returncode == 0 and proc.stdout.count("OK") == 2, proc.stdout[-2000:] + proc.stderr[-4000:]
    observed = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(o["fsdp"] and o["distributed_type"] == "DistributedType.FSDP" for o in observed), observed
    return observed[0]


@pytest.mark.slow
def test_a_bf16_policy_under_fsdp2_mixed_precision_from_the_launcher_trains_in_float32_and_resumes(tmp_path):
    # AdamW: its moments are what a checkpoint has to carry (plain SGD keeps no optimizer state)
    bf16 = dict(mixed_precision="bf16", dtype="bfloat16", HARNESS_OPTIM="adamw_torch")
    launch_fsdp2("erpo", tmp_path / "run", 29663, HARNESS_CHECKPOINTS="1", **bf16)
    resumed_run = launch_fsdp2("erpo", tmp_path / "resumed", 29664,
                               HARNESS_RESUME=str(tmp_path / "run/trainer/checkpoint-2"), **bf16)
    assert resumed_run["steps_run"] == 1  # it resumed (a run from step 0 would end with the same weights)
    assert resumed_run["logps_dtypes"] == ["torch.float32"]  # not rounded to the bf16 compute dtype
    weights = load_file(str(tmp_path / "run" / "model.safetensors"))
    start = load_file(str(ROOT / "trl_variants/default/assets/model.safetensors"))
    assert {w.dtype for w in weights.values()} == {torch.float32}  # FSDP's float32 master weights, saved as such
    # trained: off the bf16 grid the policy was loaded on (a bf16 weight updated in place stays on it)
    off_grid = sum((w != w.bfloat16().float()).sum().item() for w in weights.values())
    assert off_grid > 0.5 * sum(w.numel() for w in weights.values())
    assert max((weights[k] - start[k]).abs().max().item() for k in start) > 1e-3
    log = json.loads((tmp_path / "run" / "log_history.json").read_text())
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in log if "loss" in h)
    resumed = load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert all(torch.equal(resumed[k], weights[k]) for k in weights)  # resumed at step 2: the same step 3
    log_resumed = json.loads((tmp_path / "resumed" / "log_history.json").read_text())
    assert [h["loss"] for h in log_resumed if "loss" in h] == [h["loss"] for h in log if "loss" in h]


@pytest.mark.slow
@pytest.mark.parametrize("trainer, dtype", [("erpo", "bfloat16"), ("dph", "float32")])
def test_bf16_mixed_precision_trains_with_torch_2_11s_grouped_fsdp_hooks(tmp_path, trainer, dtype):
    """Accelerate shards the final norm and the LM head as one FSDP2 unit, with the input embeddings when they are
    tied to the head (as in the tiny model, Qwen2.5-0.5B and SmolLM2). torch 2.11 casts a unit's inputs to the compute
    dtype only where its first module runs (the embeddings here), so the decoder layers' float32 outputs (float32
    module outputs, above) reached the norm and the bf16 head as they were: "expected mat1 and mat2 to have the same
    dtype" at the first generate, for every trainer, on an H100 (results/gpu/README.md). The trainers now hand the head
    its input in its weights' dtype (``_numerics.head_input_in_its_dtype``). DPH-RL with a float32 policy: its
    offline pass generates from the model before FSDP shards it, in float32 (a cast to the compute dtype there failed
    the other way on the H100)."""
    observed = launch_fsdp2(trainer, tmp_path / "run", 29669 + (trainer == "dph"), mixed_precision="bf16", dtype=dtype,
                            HARNESS_GROUPED_HOOKS="first_only")
    assert observed["steps_run"] == 3 and observed["logps_dtypes"] == ["torch.float32"]
    log = [h for h in json.loads((tmp_path / "run" / "log_history.json").read_text()) if "loss" in h]
    assert len(log) == 3 and all(torch.isfinite(torch.tensor(h["loss"])) for h in log), log
    weights = load_file(str(tmp_path / "run" / "model.safetensors"))
    start = load_file(str(ROOT / "trl_variants/default/assets/model.safetensors"))
    assert max((weights[k] - start[k]).abs().max().item() for k in start) > 1e-4  # it trained


@pytest.mark.slow
def test_eepo_under_fsdp2_unlearns_inside_gradient_accumulation(tmp_path):
    """With gradient accumulation a rollout starts a cycle inside Accelerate's no_sync, where FSDP keeps gradients
    unreduced in its own buffers: the unlearning step then found no gradient on the shards, did nothing (stage-1
    change 0, no step measured) and left its gradient to join the training step's. Now it reduces its own backward."""
    launch_fsdp2("eepo", tmp_path / "run", 29666, HARNESS_GA="2")
    log = [h for h in json.loads((tmp_path / "run" / "log_history.json").read_text()) if "loss" in h]
    assert len(log) == 3
    assert all(h["eepo/stage1_logp_change"] < -0.01 for h in log), log  # the step lowered stage 1's log-probs
    assert all(h["eepo/unlearning_step_kept"] == pytest.approx(1.0, abs=1e-4) for h in log)  # float32: kept whole


@pytest.mark.slow
def test_eepo_under_fsdp2_bf16_mixed_precision_unlearns_on_float32_log_probs(tmp_path):
    """The paper recipe's setting (bf16 policy, fsdp2.yaml's bf16 mixed precision). Before float32 module outputs the
    stage-1 log-probs came back in bf16; with the recipe's temperature 1 some tokens had p > 0.998, the unlearning
    loss clipped them at 1 - 1e-3, which is 1 in bf16 (-log(0) = inf), and the run stopped at its first rollout with
    non-finite weights (``check_distributed_backends.py --paper``; the loss itself: test_losses.py). Here, at the
    harness's temperature 3, the log-probs' dtype and the unlearning step are checked."""
    observed = launch_fsdp2("eepo", tmp_path / "run", 29667, mixed_precision="bf16", dtype="bfloat16")
    assert observed["logps_dtypes"] == ["torch.float32"]
    log = [h for h in json.loads((tmp_path / "run" / "log_history.json").read_text()) if "loss" in h]
    assert len(log) == 3
    for h in log:
        assert 0 < h["eepo/unlearning_loss"] < 50, log  # finite: -log(1 - p) with p clipped at 1 - 1e-3 is <= 6.9
        assert h["eepo/stage1_logp_change"] < -0.01, log  # the step lowered stage 1's log-probs
    weights = load_file(str(tmp_path / "run" / "model.safetensors"))
    assert all(torch.isfinite(w).all() for w in weights.values())


@pytest.mark.slow
def test_a_sharded_state_dict_checkpoints_sharded_and_the_final_save_writes_the_whole_model(tmp_path):
    """``fsdp_state_dict_type: SHARDED_STATE_DICT`` (FSDP2's default when an accelerate config names none): the
    checkpoints keep the sharded form, and ``trainer.save_model`` writes the full weights. transformers' save wrote no
    weights at all, without a word, and the example script went on to the model card, the Hub push and "model saved
    to". (Resuming such checkpoints, on 2 processes and on 1: ``check_distributed_backends.py --paper --resume``.)"""
    launch_fsdp2("erpo", tmp_path / "run", 29668, state_dict_type="SHARDED_STATE_DICT", HARNESS_CHECKPOINTS="1",
                 HARNESS_SAVE_MODEL="1")
    checkpoint = tmp_path / "run" / "trainer" / "checkpoint-3"
    assert (checkpoint / "pytorch_model_fsdp_0").is_dir() and not (checkpoint / "model.safetensors").exists()
    saved = load_file(str(tmp_path / "run" / "saved" / "model.safetensors"))
    weights = load_file(str(tmp_path / "run" / "model.safetensors"))  # gathered by the harness itself
    assert set(saved) <= set(weights) and len(saved) >= len(weights) - 1  # (a tied lm_head may be left out)
    assert all(torch.equal(saved[k], weights[k]) for k in saved)
