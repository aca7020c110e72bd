"""A run stopped by SIGTERM with ``enable_jit_checkpoint`` (``trl_variants/_preemption.py``): the checkpoint is taken
at the end of the optimizer step under way, on every process at the same step, and resumes exactly; the example
script says so and exits without the final save.

transformers' own callback saved at the first hook after the signal: in these trainers usually
``on_pre_optimizer_step``, a checkpoint named after the last finished step but taken with the next step's rollout
generated (its random state and rollout in memory one step ahead), after which the loop applied that step anyway; and
on several processes each process saved when its own signal arrived."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from trl_variants.registry import method_classes

from ..helpers import DEFAULT_MODEL_PATH, script_finished, small_config, train_dataset
from .test_checkpoints import _assert_same_run, checkpoint_dirs, text_reward

ROOT = Path(__file__).resolve().parents[2]
RUN = dict(per_device_train_batch_size=4, max_completion_length=8, num_generations=2, max_steps=4,
           steps_per_generation=2, enable_jit_checkpoint=True, save_strategy="no")


class SigtermInStep(TrainerCallback):
    """SIGTERM to this process at the start of optimizer step ``step``, before its rollout is generated (the
    scheduler's signal lands at any point of a step; most of a step is generation)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def erpo(out: Path):
    trainer_cls, config_cls = method_classes("erpo")
    return trainer_cls(model=DEFAULT_MODEL_PATH, reward_funcs=text_reward, args=small_config(config_cls, out, **RUN),
                       train_dataset=train_dataset(16))


def test_sigterm_checkpoints_the_step_under_way_and_the_resume_is_exact(tmp_path):
    handler = signal.getsignal(signal.SIGTERM)
    whole = erpo(tmp_path / "whole")
    whole.train()
    assert whole.stopped_by_signal is None and checkpoint_dirs(tmp_path / "whole") == []  # save_strategy "no"
    stopped = erpo(tmp_path / "stopped")
    stopped.add_callback(SigtermInStep(3))
    stopped.train()
    # the step under way (3) finished, was saved with the rollout it is inside, and the run stopped there
    assert stopped.stopped_by_signal == 3 and stopped.state.global_step == 3
    assert checkpoint_dirs(tmp_path / "stopped") == ["checkpoint-3"]
    assert (tmp_path / "stopped" / "checkpoint-3" / "rollout_0.pt").exists()
    assert signal.getsignal(signal.SIGTERM) == handler  # the process's own handling is back after train()
    resumed = erpo(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "stopped" / "checkpoint-3"))
    assert resumed.stopped_by_signal is None
    _assert_same_run(whole, resumed)


def _preempt_at_its_step(trainer_state) -> None:
    """On process 0, while the rollout of step ``PREEMPT_AT_STEP`` is scored: SIGTERM to the launcher (its parent,
    ``torchrun`` or ``accelerate launch``), as a scheduler signals a job; the launcher passes it to every worker.
    ``PREEMPT_PID``: to that process instead (``scripts/slurm_train.sh``, as ``#SBATCH --signal=B:TERM`` does)."""
    if (os.environ.get("RANK") == "0" and os.environ.get("PREEMPT_AT_STEP")
            and trainer_state.global_step + 1 == int(os.environ["PREEMPT_AT_STEP"])):
        os.kill(int(os.environ.get("PREEMPT_PID") or os.getppid()), signal.SIGTERM)


def preempting_reward(completions, trainer_state, **kwargs):
    """``text_reward``, preempting at ``PREEMPT_AT_STEP``."""
    _preempt_at_its_step(trainer_state)
    return text_reward(completions)


def preempting_zero_reward(completions, trainer_state, **kwargs):
    """0 for every completion (added to a recipe's rewards, it changes nothing), preempting at ``PREEMPT_AT_STEP``
    (``scripts/check_preemption.py``)."""
    _preempt_at_its_step(trainer_state)
    return [0.0] * len(completions)


def test_a_sigterm_in_the_last_step_lets_the_run_end_and_one_at_a_stop_skips_the_evaluations(tmp_path):
    """In the last step the run is as good as done: it ends as it would (its final save is the caller's). At a stop
    the held-out evaluation due at that step is skipped (the grace is the checkpoint's) and nothing is written at the
    end of training; the resumed run measures."""
    from trl_variants.data.loading import load_default_dataset
    from trl_variants.evaluation import HeldOutCallback

    last = erpo(tmp_path / "last")
    last.add_callback(SigtermInStep(4))
    last.train()
    assert last.stopped_by_signal is None and last.state.global_step == 4
    stopped = erpo(tmp_path / "stopped")
    heldout = HeldOutCallback(stopped, load_default_dataset(0, 4)["test"], k=1, eval_steps=1, plot=False)
    stopped.add_callback(heldout)
    stopped.add_callback(SigtermInStep(2))
    stopped.train()
    assert stopped.stopped_by_signal == 2 and checkpoint_dirs(tmp_path / "stopped") == ["checkpoint-2"]
    assert [h["step"] for h in heldout.history] == [0, 1]  # before training and at step 1; not at the stop
    assert not (tmp_path / "stopped" / "heldout.json").exists()


def test_train_in_another_thread_is_refused_with_the_checkpoint_on_sigterm(tmp_path):
    import threading

    trainer, errors = erpo(tmp_path), []

    def train():
        try:
            trainer.train()
        except RuntimeError as e:
            errors.append(str(e))

    thread = threading.Thread(target=train)
    thread.start()
    thread.join(120)
    assert errors and "only the main thread" in errors[0] and trainer.state.global_step == 0


def test_a_failed_train_gives_the_process_its_sigterm_handling_back(tmp_path):
    """The flag-only handler lives for the span of ``train()``: a run that fails must not leave a process that a
    SIGTERM no longer ends."""
    class Fail(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise RuntimeError("a failure inside training")

    handler = signal.getsignal(signal.SIGTERM)
    trainer = erpo(tmp_path)
    assert signal.getsignal(signal.SIGTERM) == handler  # until train(), not caught (transformers' callback was)
    trainer.add_callback(Fail())
    with pytest.raises(RuntimeError, match="a failure inside training"):
        trainer.train()
    assert signal.getsignal(signal.SIGTERM) == handler


TWO_PROCESS_FLAGS = ["--embedded_train_size", "16", "--embedded_test_size", "8", "--per_device_train_batch_size", "4",
                     "--num_generations", "2", "--max_completion_length", "8", "--heldout_eval_steps", "0",
                     "--logging_steps", "1", "--save_strategy", "no", "--torch_threads", "1", "--max_steps", "6",
                     "--steps_per_generation", "2", "--enable_jit_checkpoint", "true", "--report_to", "none",
                     "--learning_rate", "1e-3", "--reward_funcs", f"{__name__}.preempting_reward"]


def _launch(out: Path, port: int, *flags: str, preempt_at_step: int | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore",
               TRL_VARIANTS_CACHE=str(out.parent / "cache"), PYTHONPATH=str(ROOT))
    env.pop("PREEMPT_AT_STEP", None)
    if preempt_at_step is not None:
        env["PREEMPT_AT_STEP"] = str(preempt_at_step)
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "2", "--master_port", str(port),
           str(ROOT / "examples" / "train_erpo.py"), *TWO_PROCESS_FLAGS, "--output_dir", str(out), *flags]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=400)


@pytest.mark.slow
def test_two_processes_stopped_by_sigterm_save_the_same_step_and_resume_exactly(tmp_path):
    """SIGTERM to ``torchrun`` during step 3 (inside the rollout of steps 3-4): both processes finish step 3, agree,
    save it (each its RNG state and rollout), and the script says where to resume and exits without the final model;
    the resume ends where the uninterrupted run does, bit for bit."""
    from safetensors.torch import load_file

    whole = _launch(tmp_path / "whole", 29581)
    assert script_finished(whole), whole.stdout[-2000:] + whole.stderr[-3000:]
    stopped = _launch(tmp_path / "run", 29582, preempt_at_step=3)
    said = stopped.stdout + stopped.stderr
    assert stopped.returncode != 0, said[-3000:]  # 143 from each worker; torchrun reports the signal
    assert stopped.stdout.count("stopped by SIGTERM after step 3 of 6: ") == 1, said[-3000:]
    assert "--resume_from_checkpoint true" in stopped.stdout and "model saved to" not in stopped.stdout
    assert checkpoint_dirs(tmp_path / "run") == ["checkpoint-3"]
    checkpoint = tmp_path / "run" / "checkpoint-3"
    assert {p.name for p in checkpoint.glob("rng_state_*.pth")} == {"rng_state_0.pth", "rng_state_1.pth"}
    assert {p.name for p in checkpoint.glob("rollout_*.pt")} == {"rollout_0.pt", "rollout_1.pt"}
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == 3
    assert not (tmp_path / "run" / "model.safetensors").exists()  # the final save is the finished run's
    resumed = _launch(tmp_path / "run", 29583, "--resume_from_checkpoint", "true")
    assert script_finished(resumed), resumed.stdout[-2000:] + resumed.stderr[-3000:]
    a, b = (load_file(str(tmp_path / run / "model.safetensors")) for run in ("whole", "run"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_model_only_save_with_the_checkpoint_on_sigterm_is_refused_before_anything_loads(tmp_path, monkeypatch):
    """``save_only_model`` checkpoints hold no optimizer or RNG state and a resume refuses them: the checkpoint a
    SIGTERM saves would be one nobody can resume."""
    import transformers

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    trainer_cls, config_cls = method_classes("erpo")
    args = small_config(config_cls, tmp_path, **dict(RUN, save_only_model=True))
    with pytest.raises(ValueError, match=r"ERPOTrainer: enable_jit_checkpoint=True .*save_only_model=True .*"
                                         r"--save_only_model false"):
        trainer_cls(model=DEFAULT_MODEL_PATH, reward_funcs=text_reward, args=args, train_dataset=train_dataset(16))
