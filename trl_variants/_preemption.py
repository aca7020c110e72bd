"""A run stopped by SIGTERM (a cluster preempting the job, or its time limit with ``#SBATCH --signal=B:TERM@<s>``) ends
with a checkpoint that resumes exactly, on every process at the same step: transformers' ``enable_jit_checkpoint``,
kept as the switch, with the save moved to the end of an optimizer step agreed by all processes.

transformers' own ``JITCheckpointCallback`` saves at the first of ``on_step_begin``, ``on_pre_optimizer_step`` or
``on_step_end`` after the signal. In these trainers most of a step is generation inside its first micro-batch, so
that is usually ``on_pre_optimizer_step``: a checkpoint named after the last finished step, taken with the next
step's rollout generated and its gradients accumulated (the random state and the rollout in memory one step ahead of
the weights), after which the loop still applied that step. On several processes each process saves when its own
signal arrives, so two processes can save at different points, one inside the save's collectives and the other
inside the next step's: the run hangs. Here the signal only raises a flag; at the end of each optimizer step the
processes agree (one gather of one number) whether any has it, and if so all save that step's checkpoint through
the Trainer's own save (with the rollout in memory, ``_rollout_state.py``) and stop. ``trainer.stopped_by_signal``
is then that step; the example scripts say so and exit without the final save, card and push (exit code 143, as a
process ended by SIGTERM). The save has to fit in the grace the cluster gives: the rest of the step under way and a
checkpoint (docs/reliability.md, "Preemption").
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

import torch
from transformers import TrainerCallback

EXIT_CODE = 128 + signal.SIGTERM  # how a shell reports a process ended by SIGTERM


def _handler(value):
    """A handler ``signal.signal`` accepts back: ``getsignal`` gives None for one set outside Python."""
    return signal.SIG_DFL if value is None else value


class StopOnSignal(TrainerCallback):
    """Flag on SIGTERM; at the end of an optimizer step before the last, if any process has the flag, save and stop
    on all. A SIGTERM in the last step lets the run end as it would, final save included. The handler is set for the
    span of ``train()`` only (:meth:`catching`); the process's own handling is back after it, also when training
    fails."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.flagged = False

    @contextmanager
    def catching(self):
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("enable_jit_checkpoint catches SIGTERM, which Python lets only the main thread do: call "
                               "train() from the main thread, or set enable_jit_checkpoint=False")
        self.flagged = False
        previous = _handler(signal.signal(signal.SIGTERM, self._on_signal))
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _on_signal(self, signum, frame) -> None:
        self.flagged = True  # nothing else here: the step under way finishes, and its end decides

    def _any_process_flagged(self) -> bool:
        accelerator = self.trainer.accelerator
        if accelerator.num_processes == 1:
            return self.flagged
        flags = accelerator.gather(torch.tensor([float(self.flagged)], device=accelerator.device))
        return bool(flags.max().item() > 0)

    def on_step_end(self, args, state, control, **kwargs):
        if self._any_process_flagged() and state.global_step < state.max_steps:
            control.should_save = True  # the Trainer's own save, after this callback: checkpoint-<this step>
            control.should_evaluate = False  # the grace is for the save (and save_strategy="best" keeps it)
            control.should_training_stop = True
            self.trainer.stopped_by_signal = state.global_step
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.trainer.stopped_by_signal is not None:  # the loop ends after the save: no second save or evaluation
            control.should_save = control.should_evaluate = False
        return control


class StopOnSignalMixin:
    """Mix into a GRPOTrainer subclass, before GRPOTrainer: with ``enable_jit_checkpoint``, transformers' callback is
    replaced by :class:`StopOnSignal`. ``stopped_by_signal``: the step a SIGTERM stopped the last ``train()`` at (its
    checkpoint is ``checkpoint-<step>``), else None."""

    stopped_by_signal: int | None = None
    _stop_on_signal: StopOnSignal | None = None

    def __init__(self, *args, **kwargs):
        before = _handler(signal.getsignal(signal.SIGTERM))  # transformers' callback sets its own while it builds
        try:
            super().__init__(*args, **kwargs)
        finally:  # until train() (and after a failed construction): a SIGTERM ends the process as before
            signal.signal(signal.SIGTERM, before)
        if getattr(self.args, "enable_jit_checkpoint", False):
            from transformers.trainer_jit_checkpoint import JITCheckpointCallback

            self.remove_callback(JITCheckpointCallback)
            self._stop_on_signal = StopOnSignal(self)
            self.add_callback(self._stop_on_signal)

    def train(self, *args, **kwargs):
        self.stopped_by_signal = None
        if self._stop_on_signal is None:
            return super().train(*args, **kwargs)
        with self._stop_on_signal.catching():
            return super().train(*args, **kwargs)


def check_stop_on_signal_args(args, trainer_name: str) -> None:
    """Before anything loads: ``enable_jit_checkpoint`` saves a checkpoint to resume from, which a
    ``save_only_model`` save is not (the weights alone: its resume is refused, ``_checkpoint_layout``)."""
    if getattr(args, "enable_jit_checkpoint", False) and getattr(args, "save_only_model", False):
        raise ValueError(f"{trainer_name}: enable_jit_checkpoint=True saves a checkpoint on SIGTERM to resume from, "
                         "but save_only_model=True saves the weights alone (no optimizer, scheduler or RNG state), "
                         "which a resume refuses. Fix: set save_only_model=False (--save_only_model false), or "
                         "enable_jit_checkpoint=False")


def stopped_line(trainer) -> str:
    """What the example scripts print when a SIGTERM stopped the run."""
    step = trainer.stopped_by_signal
    return (f"stopped by SIGTERM after step {step} of {trainer.state.max_steps}: {trainer.args.output_dir}/"
            f"checkpoint-{step} holds the run; the final model was not saved. Resume with the same command and "
            "--resume_from_checkpoint true")
