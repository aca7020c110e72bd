"""Where a checkpoint is resumed: on how many processes and under which backend it was written, against this run.

A resume on another number of processes (a job restarted on fewer or more GPUs) keeps the global batch
(:func:`global_batches`) and may change how it is split (:data:`LAYOUT_FIELDS`); a resume under another backend, or
from weights without optimizer state, is refused (:func:`check_same_backend`).
:func:`~trl_variants._checkpoint.check_checkpoint_record` calls both before the model loads.
"""

from __future__ import annotations

import json
import os
import warnings

from ._numerics import uses_deepspeed, uses_fsdp

# How the global batch is split over processes: a resume on another number of processes may change these when the
# global batches stay the same (:func:`global_batches`); the prompts of each rollout are then the same.
LAYOUT_FIELDS = ("world_size", "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation")


def per_process_fields(config_cls) -> tuple[str, ...]:
    """A trainer's own rows per micro-step per process (DPH-RL's ``pef_batch_size``): what each config class in its
    bases declares as ``per_process_batch_fields``. On another number of processes they may change with the split of
    the batch, and their global rows per optimizer step may not."""
    return tuple(dict.fromkeys(name for cls in config_cls.__mro__
                               for name in vars(cls).get("per_process_batch_fields", ())))


def global_batches(fields: dict, own: tuple[str, ...] = ()) -> tuple[int, ...]:
    """``(completions per optimizer step, completions per rollout, then each of ``own``'s rows per optimizer step)``
    of a record's or a run's :func:`resume_fields`."""
    rows = fields["per_device_train_batch_size"] * fields["world_size"]
    per_step = fields["world_size"] * fields["gradient_accumulation_steps"]
    return (rows * fields["gradient_accumulation_steps"], rows * fields["steps_per_generation"],
            *(fields[name] * per_step for name in own))


def other_processes(record: dict, args) -> tuple[int, int] | None:
    """``(the checkpoint's processes, this run's)`` when a resume continues on another number of processes, else
    None."""
    theirs = record.get("config", {}).get("world_size", args.world_size)
    return (theirs, args.world_size) if theirs != args.world_size else None


def check_other_processes(checkpoint: str, changed: list[str], mine: dict, theirs: dict, args) -> list[str]:
    """``changed`` (the :func:`~trl_variants._checkpoint.resume_fields` that differ between this run, ``mine``, and the
    checkpoint's record, ``theirs``) less the split of the batch, when the checkpoint was written on another number of
    processes and every global batch is the checkpoint's (:func:`global_batches`, a trainer's own
    :func:`per_process_fields` included); raises naming the products and the fix when one is not, and under
    DeepSpeed, which loads its partitioned optimizer state only on the same number of processes."""
    own = tuple(name for name in per_process_fields(type(args)) if name in mine and name in theirs)
    if "world_size" not in changed or not all(name in theirs for name in LAYOUT_FIELDS):
        return changed
    if global_batches(mine, own) != global_batches(theirs, own):
        (a, b, *x), (c, d, *y) = global_batches(theirs, own), global_batches(mine, own)
        if (a, b) == (c, d):  # a trainer's own rows per step differ
            raise ValueError(
                f"checkpoint {checkpoint} was written on {theirs['world_size']} process(es), this run has "
                f"{mine['world_size']}: a resume on another number of processes keeps every global batch, but "
                + "; ".join(f"{name} x processes x gradient_accumulation_steps is {p} in the checkpoint "
                            f"({theirs[name]} there) and {q} in this run ({mine[name]})"
                            for name, p, q in zip(own, x, y, strict=True) if p != q)
                + f". Set it so that the products are equal, or resume on {theirs['world_size']} process(es)")
        raise ValueError(
            f"checkpoint {checkpoint} was written on {theirs['world_size']} process(es), this run has "
            f"{mine['world_size']}: a resume on another number of processes keeps the global batch, but the "
            f"checkpoint's is {a} completions per optimizer step and {b} per rollout (per_device_train_batch_size "
            f"{theirs['per_device_train_batch_size']} x {theirs['world_size']} process(es) x "
            f"gradient_accumulation_steps {theirs['gradient_accumulation_steps']} / x steps_per_generation "
            f"{theirs['steps_per_generation']}), this run's {c} and {d}. Set gradient_accumulation_steps and "
            "steps_per_generation (or per_device_train_batch_size) so that both products are the checkpoint's "
            "(trl-variants train does this for a shipped recipe unless --keep_recipe_batch false), or resume on "
            f"{theirs['world_size']} process(es)")
    if uses_deepspeed(args):
        raise ValueError(
            f"checkpoint {checkpoint} was written on {theirs['world_size']} process(es), this run has "
            f"{mine['world_size']}, under DeepSpeed: DeepSpeed partitions the optimizer state by process and "
            "loads it only on the same number (its universal checkpoints need state that transformers does not "
            f"save). Resume on {theirs['world_size']} process(es); or start a new run from the checkpoint's "
            f"weights (model={checkpoint!r}; the optimizer state and the schedule start again); a run that may "
            "have to continue on another number of processes can train under DDP or FSDP2, which resume on any "
            "number with the same global batch")
    return [name for name in changed if name not in LAYOUT_FIELDS and name not in own]


def checkpoint_backend(checkpoint: str) -> str | None:
    """The backend whose optimizer state ``checkpoint`` holds, read from the files transformers writes: DeepSpeed's
    ``global_step<N>/`` (ZeRO-3 when it has per-process model states), FSDP's ``pytorch_model_fsdp*``, a plain
    ``optimizer.pt`` (DDP or one process); None without optimizer state (``save_only_model``)."""
    names = os.listdir(checkpoint)
    steps = [name for name in names if name.startswith("global_step") and os.path.isdir(os.path.join(checkpoint, name))]
    if steps:
        per_process = any(f.startswith("zero_pp_rank_") and f.endswith("_model_states.pt")
                          for step in steps for f in os.listdir(os.path.join(checkpoint, step)))
        return "DeepSpeed ZeRO-3" if per_process else "DeepSpeed ZeRO-1/2"
    if any(name.startswith("pytorch_model_fsdp") for name in names):
        return "FSDP"
    return "DDP or one process" if "optimizer.pt" in names else None


def run_backend(args) -> str:
    """The backend this run trains under, in :func:`checkpoint_backend`'s words (``DeepSpeed`` when its ZeRO stage is
    not known before the accelerator exists)."""
    if uses_deepspeed(args):
        stage = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")  # accelerate launch, zero_stage in its config
        # a DeepSpeed JSON: the training config's, or the one accelerate launch's deepspeed_config_file names
        config = getattr(args, "deepspeed", None) or os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
        if stage is None and isinstance(config, str) and os.path.isfile(config):
            with open(config) as f:
                config = json.load(f)
        if stage is None and isinstance(config, dict):
            stage = config.get("zero_optimization", {}).get("stage")
        if str(stage).strip() in ("0", "1", "2", "3"):
            return "DeepSpeed ZeRO-3" if str(stage).strip() == "3" else "DeepSpeed ZeRO-1/2"
        return "DeepSpeed"
    return "FSDP" if uses_fsdp(args) else "DDP or one process"


def check_same_backend(checkpoint: str, args) -> None:
    """A checkpoint resumed under another backend than it was written with: transformers fails after the model load
    and the offline pass (FSDP's or DeepSpeed's files missing, a bare ``AssertionError`` between ZeRO stages), or,
    from DeepSpeed to DDP, loads the weights and skips the optimizer state without a word. Refused before the model
    loads, naming both. So is a checkpoint of weights without optimizer state (``save_only_model``), which
    transformers resumes with the optimizer, the schedule and the random state started again."""
    names = os.listdir(checkpoint)
    weights = any(name.endswith((".safetensors", ".bin")) and name.startswith(("model", "pytorch_model", "adapter_model"))
                  for name in names)
    if weights and not any(name.startswith(("optimizer", "global_step", "pytorch_model_fsdp")) for name in names):
        raise ValueError(
            f"checkpoint {checkpoint} holds no optimizer state (saved with save_only_model=True): transformers would "
            "resume it with Adam's moments, the learning-rate schedule (its warmup included) and the random state "
            f"started again, without a word. Start a new run from its weights (model={checkpoint!r}), or save full "
            "checkpoints (save_only_model=False) for runs you may resume")
    written, running = checkpoint_backend(checkpoint), run_backend(args)
    if written is None or written == running or (running == "DeepSpeed" and written.startswith("DeepSpeed")):
        return
    what = ("transformers would load its weights and start the optimizer state (Adam's moments) again without a "
            "word" if written.startswith("DeepSpeed") and running == "DDP or one process" else
            "transformers cannot read its optimizer state, and fails after the model load")
    raise ValueError(
        f"checkpoint {checkpoint} was written under {written}, and this run trains under {running}: {what}. Resume "
        "with the backend it was written with (the same accelerate launch --config_file, or the same deepspeed / fsdp "
        f"option of the training config), or start a new run from its weights (model={checkpoint!r}; the optimizer "
        "state and the schedule start again)")


def warn_other_processes(checkpoint: str, processes: tuple[int, int], args, trainer_name: str) -> None:
    """A resume on another number of processes (:func:`other_processes`), said before training goes on."""
    per_step, per_rollout = global_batches({name: getattr(args, name) for name in LAYOUT_FIELDS})
    warnings.warn(
        f"{trainer_name}: {checkpoint} was written on {processes[0]} process(es) and this run has {processes[1]}. The "
        f"global batch is the same ({per_step} completions per optimizer step, {per_rollout} per rollout), and so are "
        "the prompts of every rollout; their completions are sampled anew (each process has its own random state), "
        "and where a rollout spans several optimizer steps its prompts are split over them anew, so the run "
        "continues the same training but not bit for bit as the uninterrupted one", stacklevel=3)
