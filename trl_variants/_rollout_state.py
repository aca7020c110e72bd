"""The rollout in memory, in a checkpoint saved inside it.

GRPOTrainer generates once every ``steps_per_generation x num_iterations`` micro-steps and trains the micro-batches of
that rollout from memory. A checkpoint saved inside a rollout holds, per process, the micro-batches still to train
(``rollout_<process>.pt``, :func:`save_rollout`); a resume puts them back (:func:`load_rollout`, called by
:class:`~trl_variants._checkpoint.CheckpointStateMixin`).
"""

from __future__ import annotations

import math
import os
import warnings

import torch


def rollout_steps(args) -> int:
    """The smallest number of optimizer steps that always ends on a rollout boundary: GRPOTrainer generates once
    every ``steps_per_generation x num_iterations`` micro-steps, ``gradient_accumulation_steps`` to an optimizer
    step."""
    every = args.steps_per_generation * args.num_iterations
    return every // math.gcd(every, args.gradient_accumulation_steps)


def inside_a_rollout(step: int, args) -> bool:
    """Whether optimizer step ``step`` ends inside a rollout: the rollout's later micro-batches are still to train,
    and a checkpoint saved there holds them (:func:`save_rollout`)."""
    return step % rollout_steps(args) != 0


ROLLOUT_FORMAT = 1


def rollout_file(checkpoint: str, process_index: int) -> str:
    """Where process ``process_index`` keeps its rollout in ``checkpoint`` (beside transformers' per-process
    ``rng_state_<i>.pth``)."""
    return os.path.join(checkpoint, f"rollout_{process_index}.pt")


def _moved(value, device):
    """``value`` (tensors in dicts, lists and tuples) with every tensor on ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _moved(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_moved(v, device) for v in value)
    return value


def save_rollout(trainer, checkpoint: str, process_index: int) -> None:
    """Writes this process's rollout in memory into ``checkpoint`` when it is saved inside a rollout.

    GRPOTrainer generates once every ``steps_per_generation x num_iterations`` micro-steps and trains the micro-batches
    of that rollout from memory (``_buffered_inputs``, indexed by its micro-step counter ``_step``). transformers'
    checkpoint does not hold them, so a run resumed inside a rollout generated it again: other completions, other
    weights than the uninterrupted run. The file holds both (tensors on the CPU); a checkpoint between rollouts needs
    neither, and a stale file of an earlier run in the same folder is removed. Written atomically (a temporary file
    renamed), every process its own."""
    path = rollout_file(checkpoint, process_index)
    every = trainer.args.steps_per_generation * trainer.num_iterations
    if trainer._buffered_inputs is None or trainer._step % every == 0:
        if os.path.exists(path):
            os.remove(path)
        return
    payload = {"format": ROLLOUT_FORMAT, "global_step": trainer.state.global_step, "step": trainer._step,
               "buffered_inputs": _moved(trainer._buffered_inputs, "cpu")}
    torch.save(payload, path + ".tmp")
    os.replace(path + ".tmp", path)


def load_rollout(checkpoint: str, process_index: int, device, global_step: int) -> tuple[int, list] | None:
    """``(micro-step, rollout)`` as :func:`save_rollout` wrote them for this process, tensors on ``device``; None when
    the checkpoint holds none (saved between rollouts, or by a trl_variants before this file existed), and, with a
    warning, when the file was saved at another step than the checkpoint's ``global_step`` (a file left in the folder
    by another run)."""
    path = rollout_file(checkpoint, process_index)
    if not os.path.isfile(path):
        return None
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if saved.get("format", ROLLOUT_FORMAT) > ROLLOUT_FORMAT:
        raise ValueError(f"{path} was written by a newer trl_variants (rollout format {saved['format']}, this version "
                         f"reads {ROLLOUT_FORMAT}): resume it with that version")
    if saved.get("global_step") != global_step:
        warnings.warn(f"{path} was saved after step {saved.get('global_step')}, but {checkpoint} after step "
                      f"{global_step} (a file of another run left in that folder): it is not used", stacklevel=3)
        return None
    return saved["step"], _moved(saved["buffered_inputs"], device)


def warn_resume_inside_a_rollout(checkpoint: str, step: int, args, trainer_name: str,
                                 processes: int | None = None) -> None:
    """A checkpoint saved inside a rollout without the rollout (:func:`save_rollout`: an older trl_variants, or a
    file lost), or written on another number of ``processes``, said before training goes on: that rollout is
    generated again. ``step``: the checkpoint's."""
    if inside_a_rollout(step, args):
        k = rollout_steps(args)
        why = (f"was written on {processes} process(es), whose rollout files hold one process's share each"
               if processes else f"holds no {os.path.basename(rollout_file(checkpoint, args.process_index))} with "
               "that rollout (written before trl_variants kept rollouts in checkpoints, or removed)")
        warnings.warn(
            f"{trainer_name}: {checkpoint} was saved after step {step}, inside a rollout (rollouts end on multiples of "
            f"{k} optimizer steps), and {why}: this run generates the rollout again and its steps up to "
            f"{(step // k + 1) * k} train on other completions than the uninterrupted run. For an exact resume use a "
            f"checkpoint at a multiple of {k} (e.g. checkpoint-{step // k * k})",
            stacklevel=3)
