"""What every checkpoint of the four trainers carries, and how a resume checks and restores it.

Each checkpoint holds a *record*: the trainer's class name, the config values that must not change across a resume
(:func:`resume_fields`) and the algorithm state (EEPO's entropy-gate history, DPH-RL's D_pef stream position; empty
for ERPO and A*-PO). It is written through transformers' public mechanism, a ``TrainerCallback`` that is an
``ExportableState``, so it lives inside the checkpoint's ``trainer_state.json`` under
``stateful_callbacks["TrlVariantsCheckpoint"]``.

Why that mechanism fits (transformers 5.23, ``Trainer._save_checkpoint``): the model, optimizer, scheduler, scaler and
RNG states are saved first; then the ``state()`` of every ``ExportableState`` callback is collected into
``TrainerState.stateful_callbacks`` and ``trainer_state.json`` is written; only after that come the Hub upload
(``_push_from_checkpoint``) and the rotation of old checkpoints (``rotate_checkpoints``). So the record is complete
inside the checkpoint before anything is uploaded or deleted, and a transformers upgrade that keeps the public
callback API keeps it. ``trainer_state.json`` is the last file of a checkpoint but it is not written atomically
(``TrainerState.save_to_json`` opens the final path and writes): a save interrupted before or while writing it
leaves a checkpoint without it or with a truncated one, while the previous checkpoint still exists (rotation had not
run yet). Such a checkpoint is *incomplete*: ``resume_from_checkpoint=True`` skips it (and renames it
``_incomplete-checkpoint-N`` so that later rotations and Hub uploads ignore it) and resumes from the last complete
one; an explicit path to it is refused, naming the file.

A checkpoint saved inside a rollout also holds, per process, the rollout's micro-batches still to train
(``rollout_<process>.pt``, :func:`save_rollout`), written beside transformers' per-process RNG state and before
``trainer_state.json``; a resume puts them back (:func:`load_rollout`).

Restoring: transformers restores callback states only with ``restore_callback_states_from_checkpoint=True`` (default
False), and then by re-creating the callback from stored ``args`` / ``attributes``, without the trainer. The record
must be checked and restored on every resume and before any weights are loaded, so :meth:`CheckpointStateMixin.train`
reads it itself with the public ``TrainerState.load_from_json`` and only then calls ``Trainer.train``. With
``restore_callback_states_from_checkpoint=True`` transformers re-creates our callback as well; the new instance finds
its trainer through :data:`_TRAINING` and keeps working.
"""

from __future__ import annotations

import contextvars
import dataclasses
import enum
import json
import os
import re
import warnings

import torch
from transformers import TrainerCallback, TrainerState
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOConfig

from ._checkpoint_layout import (
    check_other_processes,
    check_same_backend,
    other_processes,
    warn_other_processes,
)
from ._rollout_state import load_rollout, save_rollout, warn_resume_inside_a_rollout
from ._validation import check_trained_a_step

RECORD_FORMAT = 1
INCOMPLETE_PREFIX = "_incomplete-"  # leading "_": excluded from Hub uploads, and not a "checkpoint-*" folder

# GRPOConfig fields a resume must not change: the optimizer's hyper-parameters (the optimizer and scheduler states in
# the checkpoint silently override them), what fixes the batches and their order, and GRPO's objective and sampling.
RESUME_FIELDS = (
    "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "optim",
    "seed", "data_seed", "per_device_train_batch_size", "gradient_accumulation_steps", "world_size",
    "steps_per_generation", "num_generations", "num_iterations", "shuffle_dataset",
    "beta", "loss_type", "epsilon", "epsilon_high", "scale_rewards", "reward_weights",
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_completion_length",
)


def free_fields(config_cls) -> frozenset[str]:
    """The fields of a trainer's own config that cannot change the result, so a resume may change them (every other
    own field is checked): what each config class in its bases declares as ``resume_free_fields`` (a composed
    config has every one of its bases')."""
    return frozenset(name for cls in config_cls.__mro__ for name in vars(cls).get("resume_free_fields", ()))


_CHECKPOINT_DIR = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
# The trainer whose ``train()`` is running: a callback that transformers re-creates on resume (with
# ``restore_callback_states_from_checkpoint=True``) is constructed without arguments and binds to it.
_TRAINING: contextvars.ContextVar = contextvars.ContextVar("trl_variants_training", default=None)


def _plain(value):
    """``value`` as it reads back from JSON (enums by value, tuples as lists), for comparing records."""
    return json.loads(json.dumps(value, default=lambda v: v.value if isinstance(v, enum.Enum) else str(v)))


def resume_fields(args) -> dict:
    """The config values of ``args`` that must be equal in a checkpoint and in the run that resumes it: the common
    :data:`RESUME_FIELDS` and every field the trainer's config adds to GRPOConfig, except its :func:`free_fields`."""
    grpo, free = {f.name for f in dataclasses.fields(GRPOConfig)}, free_fields(type(args))
    own = [f.name for f in dataclasses.fields(args) if f.name not in grpo and f.name not in free]
    unordered = getattr(type(args), "resume_unordered_fields", ())  # lists whose order cannot change the result
    return {name: sorted(_plain(getattr(args, name))) if name in unordered else _plain(getattr(args, name))
            for name in (*RESUME_FIELDS, *own) if hasattr(args, name)}


class TrlVariantsCheckpoint(TrainerCallback, ExportableState):
    """Puts the trainer's record into every checkpoint (``state()``, called by ``Trainer._save_checkpoint`` on the
    saving process). The algorithm state is the same on every process by construction (EEPO's gate averages the
    entropy over all processes; DPH-RL's D_pef stream is one global stream), so the saving process's is the run's;
    the two-process tests check both."""

    def __init__(self, trainer=None):
        self.trainer = trainer if trainer is not None else _TRAINING.get()
        if self.trainer is None:
            raise TypeError("TrlVariantsCheckpoint belongs to a trl_variants trainer; it is created by the trainer")

    def state(self) -> dict:
        trainer = self.trainer
        return {"format": RECORD_FORMAT, "trainer": type(trainer).__name__, "config": resume_fields(trainer.args),
                "algorithm_state": trainer._extra_state()}

    def on_epoch_begin(self, args, state, control, **kwargs):
        """The train sampler's order for this epoch (:class:`ReplayableEpochs`), set on the sampler the training
        dataloader was built with. Accelerate's ``set_epoch`` does not reach it through every wrapping: a mid-epoch
        resume on several processes wraps it four deep (``SkipBatchSampler`` > ``BatchSamplerShard`` >
        ``BatchSampler``). ``state.epoch`` is the epoch about to run (a resumed run's is the checkpoint's, e.g. 1.5
        in the middle of epoch 1; after a whole epoch e it is exactly e + 1.0)."""
        sampler = getattr(self.trainer, "_train_sampler", None)
        if sampler is not None:
            sampler.set_epoch(int(state.epoch + 1e-9))


def checkpoint_problem(path: str) -> str | None:
    """Why ``path`` is not a complete checkpoint (its ``trainer_state.json`` missing or unreadable), else None."""
    state_file = os.path.join(path, TRAINER_STATE_NAME)
    if not os.path.isdir(path):
        return f"{path} is not a directory"
    if not os.path.isfile(state_file):
        return f"{state_file} is missing (not a Trainer checkpoint, or its save was interrupted before that file)"
    try:
        TrainerState.load_from_json(state_file)
    except (OSError, ValueError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        return f"{state_file} is unreadable ({type(e).__name__}: {e}; an interrupted save leaves it so)"
    return None


def resume_target(value) -> str | bool | None:
    """What a ``resume_from_checkpoint`` value asks for: ``None`` (no resume: ``None``, ``False``, ``""``,
    ``"false"``), ``True`` (the last complete checkpoint of output_dir: ``True``, ``"true"``, ``"last"``, any case;
    the strings are what ``--resume_from_checkpoint true`` gives) or a checkpoint path (a ``str``)."""
    if value is None or value is False:
        return None
    if value is True:
        return True
    text = os.fspath(value).strip()
    if text.lower() in ("", "false"):
        return None
    if text.lower() in ("true", "last"):
        return True
    return text


def last_complete_checkpoint(output_dir: str) -> tuple[str, list[tuple[str, str]]]:
    """``(path, skipped)``: the newest complete ``checkpoint-N`` of ``output_dir`` and the newer incomplete ones,
    each with why (:func:`checkpoint_problem`); nothing is moved. Raises naming ``output_dir`` and the fix when it
    holds no checkpoint, or no complete one."""
    out = output_dir
    found = sorted((int(m.group(1)), name) for name in (os.listdir(out) if os.path.isdir(out) else [])
                   if (m := _CHECKPOINT_DIR.match(name)) and os.path.isdir(os.path.join(out, name)))
    if not found:
        where = "does not exist" if not os.path.isdir(out) else "holds no checkpoint-N folder"
        raise ValueError(f"resume_from_checkpoint=True (--resume_from_checkpoint true / last) resumes the last "
                         f"checkpoint in output_dir, but {out} {where}. Fix: pass the output_dir of the run to resume "
                         "(--output_dir), or a checkpoint path (--resume_from_checkpoint <output_dir>/checkpoint-N), "
                         "or drop --resume_from_checkpoint to start a new run")
    skipped = []
    for _, name in reversed(found):
        path = os.path.join(out, name)
        problem = checkpoint_problem(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    raise ValueError(f"no complete checkpoint in {out}: " + "; ".join(why for _, why in skipped) + ". Start a "
                     "new run without resume_from_checkpoint")


class ReplayableEpochs(torch.utils.data.Sampler):
    """GRPOTrainer's ``RepeatSampler``, with the order of every epoch reproducible from any checkpoint.

    TRL's sampler draws one permutation per pass from a generator seeded once, and has no ``set_epoch``. A run resumed
    in epoch k >= 1 builds a new sampler, so it took epoch 0's order for epoch k; resumed mid-epoch, it then skipped
    the first batches of that order. The prompts it trained were not the uninterrupted run's: within that epoch some
    came twice and others not at all. The paper recipes train for many epochs (A*-PO 25).

    At the start of each epoch, ``set_epoch(k)`` (called by :class:`TrlVariantsCheckpoint`'s ``on_epoch_begin``, and
    by transformers and Accelerate where their wrapping reaches it) re-seeds the generator and draws the k
    permutations the earlier epochs drew, so the generator is where k passes leave it. An uninterrupted run keeps
    TRL's order exactly, and a resumed run takes the same order. The generator's state at construction is what is
    restored (a sampler without a seed starts from torch's fixed default too). Without shuffling there is nothing to
    replay. Iterated without ``set_epoch`` (A*-PO's look-ahead), it draws successive epochs as TRL's does."""

    def __init__(self, sampler):
        self.sampler = sampler
        self._start = sampler.generator.get_state() if getattr(sampler, "shuffle", False) else None

    def __iter__(self):
        return iter(self.sampler)

    def __len__(self):
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        s = self.sampler
        if self._start is None:
            return
        s.generator.set_state(self._start)
        for _ in range(epoch):  # the draws of the epochs before (RepeatSampler.__iter__: one randperm each)
            torch.randperm(s.num_samples, generator=s.generator)


class CheckpointStateMixin:
    """Mix into a GRPOTrainer subclass, before GRPOTrainer. Override ``_extra_state`` / ``_load_extra_state`` when the
    algorithm keeps state between steps (JSON-serialisable). The train sampler replays its epochs' order on a resume
    (:class:`ReplayableEpochs`)."""

    def _get_train_sampler(self, dataset=None):
        self._last_sampler = ReplayableEpochs(super()._get_train_sampler(dataset))
        return self._last_sampler

    def get_train_dataloader(self):
        """transformers' training dataloader; the sampler it was built with is kept for ``on_epoch_begin`` (A*-PO's
        look-ahead builds samplers of its own, outside this call)."""
        self._last_sampler = None
        loader = super().get_train_dataloader()
        self._train_sampler = self._last_sampler  # None for a streamed dataset (no sampler)
        return loader

    def __init__(self, *args, **kwargs):
        # ``args.resume_from_checkpoint`` (transformers leaves it to scripts, which pass it to train()): its checkpoint
        # is checked now, before GRPOTrainer loads the model and before the trainer's offline pass, not only at train()
        # (``True``, or the command line's ``"true"`` / ``"last"``: the last complete checkpoint of output_dir)
        config = kwargs["args"] if "args" in kwargs else args[2] if len(args) > 2 else None
        resume = resume_target(getattr(config, "resume_from_checkpoint", None))
        if resume is True:
            resume = last_complete_checkpoint(config.output_dir)[0]
        if resume is not None:
            check_checkpoint_record(resume, type(self).__name__, config)
        super().__init__(*args, **kwargs)
        self.add_callback(TrlVariantsCheckpoint(self))

    def _extra_state(self) -> dict:
        return {}

    # ------------------------------------------------------------------------------------ the rollout in memory ---
    def _save_rng_state(self, output_dir: str) -> None:
        """transformers saves each process's RNG state here, on every process, only in a checkpoint that can be resumed
        (not with ``save_only_model``) and before ``trainer_state.json``; the rollout in memory goes beside it
        (:func:`save_rollout`). The barrier: every process's file is written before process 0 writes
        ``trainer_state.json``, the mark of a complete checkpoint."""
        super()._save_rng_state(output_dir)
        save_rollout(self, output_dir, self.args.process_index)
        self.accelerator.wait_for_everyone()

    def _restore_rollout(self, checkpoint: str, step: int, written_on: int | None = None) -> None:
        """The rollout a checkpoint inside a rollout holds for each process, back in memory (:func:`load_rollout`).
        Every process does the same: where one process has no file, none restores (each would otherwise generate or
        not on its own, and the collective calls of generation would wait forever). Without a rollout the run
        generates at its first step (any rollout of an earlier ``train()`` of this trainer is dropped), with the
        micro-step counter where transformers resumes the data (inside a rollout, the dataloader stands in that
        rollout's repeated batches: a counter at 0 generated one rollout late from then on), said when the checkpoint
        is inside a rollout. A checkpoint of another number of processes is read by none (each file holds
        one process's share of the rollout: ``written_on``, its number of processes). ``step``: the checkpoint's."""
        saved = load_rollout(checkpoint, self.args.process_index, self.accelerator.device, step) \
            if written_on is None else None
        if self.args.world_size > 1:
            found = self.accelerator.gather(torch.tensor([saved is not None], device=self.accelerator.device))
            saved = saved if bool(found.all()) else None
        if saved is None:  # generate at the first step, aligned where transformers resumes the data: inside a rollout,
            # the micro-steps of it already trained (the dataloader stands in that rollout's repeated batches)
            saved = (step * self.args.gradient_accumulation_steps
                     % (self.args.steps_per_generation * self.num_iterations), None)
        self._step, self._buffered_inputs = saved
        if saved[1] is None and self.args.process_index == 0:
            warn_resume_inside_a_rollout(checkpoint, step, self.args, type(self).__name__, written_on)

    def _load_extra_state(self, state: dict) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} keeps no algorithm state, the checkpoint has {sorted(state)}")

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """``Trainer.train``, after checking that the checkpoint to resume is complete, was written by this trainer
        with the same :func:`resume_fields`, and restoring its algorithm state. ``resume_from_checkpoint`` as
        :func:`resume_target` reads it (``True`` / ``"true"`` / ``"last"``: the last complete checkpoint). A run that
        should have trained and ran no step is an error (:func:`~trl_variants._validation.check_trained_a_step`)."""
        resume_from_checkpoint, start_step = resume_target(resume_from_checkpoint), 0
        if resume_from_checkpoint is not None:
            if resume_from_checkpoint is True:
                resume_from_checkpoint = self._last_complete_checkpoint()
            moved = other_processes(self._restore_record(resume_from_checkpoint), self.args)
            start_step = TrainerState.load_from_json(os.path.join(resume_from_checkpoint, TRAINER_STATE_NAME)).global_step
            if self.args.process_index == 0:
                print(resume_line(type(self).__name__, resume_from_checkpoint, self.args.max_steps))
                if moved:
                    warn_other_processes(resume_from_checkpoint, moved, self.args, type(self).__name__)
            self._restore_rollout(resume_from_checkpoint, start_step, moved[0] if moved else None)
            restore_indexed_cpu_locations()
        token = _TRAINING.set(self)
        try:
            output = super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            _TRAINING.reset(token)
        check_trained_a_step(self, start_step)
        return output

    # ------------------------------------------------------------------------------------------------ resume ---
    def _last_complete_checkpoint(self) -> str:
        """The newest complete ``checkpoint-N`` of ``output_dir``; newer incomplete ones are renamed aside."""
        out = self.args.output_dir
        path, skipped = last_complete_checkpoint(out)
        for bad, why in skipped:
            aside = os.path.join(out, INCOMPLETE_PREFIX + os.path.basename(bad))
            n = 0
            while os.path.exists(aside):  # an earlier interruption at the same step
                n += 1
                aside = os.path.join(out, f"{INCOMPLETE_PREFIX}{os.path.basename(bad)}-{n}")
            if self.args.should_save:
                os.rename(bad, aside)
            warnings.warn(f"{bad} is incomplete: {why}. Resuming from {path}, the last complete checkpoint; the "
                          f"incomplete one is moved to {aside} (delete it when you no longer need it)", stacklevel=3)
        return path

    def _restore_record(self, checkpoint: str) -> dict:
        record = check_checkpoint_record(checkpoint, type(self).__name__, self.args)
        self._load_extra_state(record.get("algorithm_state", {}))
        return record


def resume_line(trainer_name: str, checkpoint: str, max_steps: int) -> str:
    """What a resumed run says first: the checkpoint and the step training continues from."""
    step = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE_NAME)).global_step
    until = f" to step {max_steps}" if max_steps and max_steps > 0 else ""
    return f"{trainer_name}: resuming from {checkpoint} (after step {step}; training continues{until})"


def check_checkpoint_record(checkpoint: str, trainer_name: str, args) -> dict:
    """The record of ``checkpoint`` (see the module docstring), after checking that the checkpoint is complete and was
    written by ``trainer_name`` with the same :func:`resume_fields` as ``args``; raises naming what differs and the
    fix. On another number of processes the split of the batch may differ when the global batches do not
    (:func:`~trl_variants._checkpoint_layout.check_other_processes`); the backend may not change
    (:func:`~trl_variants._checkpoint_layout.check_same_backend`). Reads ``trainer_state.json`` and the checkpoint's
    file names: a trainer runs it at construction (before the model load and any offline pass, :meth:`CheckpointStateMixin.__init__`) and again at ``train()``, where the algorithm state is restored."""
    problem = checkpoint_problem(checkpoint)
    if problem is not None:
        raise ValueError(f"cannot resume from {checkpoint}: {problem}. Resume from the previous checkpoint, or pass "
                         "resume_from_checkpoint=True to pick the last complete one (--resume_from_checkpoint true)")
    state_file = os.path.join(checkpoint, TRAINER_STATE_NAME)
    record = TrainerState.load_from_json(state_file).stateful_callbacks.get(TrlVariantsCheckpoint.__name__)
    if not isinstance(record, dict) or "trainer" not in record:
        raise ValueError(
            f"{state_file} has no trl_variants record (stateful_callbacks[{TrlVariantsCheckpoint.__name__!r}]): "
            f"checkpoint {checkpoint} was not written by {trainer_name} (it comes from another trainer, e.g. plain "
            "GRPOTrainer, or from a trl_variants version that kept its state in trl_variants_state.json). Start a "
            f"new run without resume_from_checkpoint (model={checkpoint!r} starts it from those weights)")
    if record.get("format", RECORD_FORMAT) > RECORD_FORMAT:
        raise ValueError(f"checkpoint {checkpoint} was written by a newer trl_variants (record format "
                         f"{record['format']}, this version reads {RECORD_FORMAT}): resume it with that version")
    if record["trainer"] != trainer_name:
        raise ValueError(f"checkpoint {checkpoint} was written by {record['trainer']}; resume it with "
                         f"{record['trainer']}, or start a new run without resume_from_checkpoint")
    mine, theirs = resume_fields(args), record.get("config", {})
    inert = getattr(type(args), "inert_fields", None)  # fields that change nothing in both runs are not compared
    skip = inert(mine) & inert(theirs) if inert else set()
    changed = [name for name in mine if name in theirs and name not in skip and mine[name] != theirs[name]]
    changed = check_other_processes(checkpoint, changed, mine, theirs, args)
    if changed:
        lines = "; ".join(f"{name}: checkpoint {theirs[name]!r}, this run {mine[name]!r}" for name in changed)
        raise ValueError(
            f"checkpoint {checkpoint} was written with other settings ({lines}). A resume continues the same run: "
            f"set {', '.join(changed)} back to the checkpoint's value(s), or start a new run without "
            f"resume_from_checkpoint (model={checkpoint!r} starts it from those weights)")
    check_same_backend(checkpoint, args)
    return record


def _keep_on_the_cpu(storage, location: str):
    return storage if location.startswith("cpu:") else None


def restore_indexed_cpu_locations() -> None:
    """Let ``torch.load`` map storages to an indexed CPU device (``cpu:0``), once per process, under transformers up to
    5.17: there ``Trainer`` loads the optimizer state of a run on several processes with ``map_location=args.device``,
    which on CPU processes is ``cpu:0``, a location torch refuses ("don't know how to restore data location of
    torch.storage.UntypedStorage (tagged with cpu:0)"), so no run on several CPU processes could resume. 5.18 maps it
    to ``"cpu"``, but the newest transformers the ``[vllm]`` extra allows is 5.17. Registers a deserializer with
    torch's public ``torch.serialization.register_package`` that keeps such a storage on the CPU (nothing else)."""
    global _INDEXED_CPU_REGISTERED
    import transformers
    from packaging.version import Version

    if _INDEXED_CPU_REGISTERED or Version(transformers.__version__) >= Version("5.18"):
        return
    torch.serialization.register_package(5, lambda storage: None, _keep_on_the_cpu)
    _INDEXED_CPU_REGISTERED = True


_INDEXED_CPU_REGISTERED = False
