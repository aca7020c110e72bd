"""A recipe's global batch on this launch's process count: a YAML whose header states ``# processes: N`` keeps its
batch when launched on another count (:func:`recipe_batch`), or the run is refused where no whole numbers keep it."""

from __future__ import annotations

import re
from pathlib import Path

from ..recipe_catalog import RECIPES_DIR, recipe_name

BATCH_FLAGS = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
               "generation_batch_size", "pef_batch_size")
"""The fields that size a run's batch. Given on the command line, they decide it: :func:`recipe_batch` then rescales
nothing (``scripts/slurm_train.sh`` passes its own rescaled values this way, so nothing is rescaled twice)."""

_PROCESSES_LINE = re.compile(r"^#\s*processes:\s*(\d+)")


def recipe_processes(path: str | Path) -> int | None:
    """The process count a YAML's batch arithmetic is written for: its ``# processes: N`` header line (in the comment
    block that opens the file, as ``trainers_tests/examples/test_configs.py`` reads it), or None."""
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            return None
        match = _PROCESSES_LINE.match(line.strip())
        if match:
            return int(match.group(1))
    return None


def _given(argv: list[str]) -> list[str]:
    """The option names of ``argv`` (``--name value``, ``--name=value``; dashes read as underscores, as
    ``HfArgumentParser`` accepts both)."""
    return [a[2:].split("=", 1)[0].replace("-", "_") for a in argv if a.startswith("--")]


def _keep_recipe_batch(argv: list[str], raw: dict) -> bool:
    """``keep_recipe_batch`` as the parser will read it (the YAML's value, a flag overriding it), read before
    parsing because the rescaled values are passed to the parser."""
    from transformers.hf_argparser import string_to_bool

    value = raw.get("keep_recipe_batch", True)
    for i, arg in enumerate(argv):
        name = arg[2:].split("=", 1)[0].replace("-", "_") if arg.startswith("--") else None
        if name == "no_keep_recipe_batch":
            value = False
        elif name == "keep_recipe_batch":
            text = (arg.split("=", 1)[1] if "=" in arg else
                    argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else "true")
            try:
                value = string_to_bool(text)
            except Exception:  # the parser refuses it, naming the flag
                pass
    return bool(value)


def _batch_values(raw: dict, config_cls) -> dict:
    """The YAML's batch fields, with the config class's defaults for those it does not set."""
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(config_cls) if f.default is not dataclasses.MISSING}
    return {name: raw.get(name, defaults.get(name)) for name in BATCH_FLAGS}


def _rescaled(values: dict, written: int, processes: int) -> list[tuple[str, int, int]] | None:
    """``[(field, recipe value, value on processes), ...]`` keeping the global batch of ``values`` (written for
    ``written`` processes) on ``processes``: gradient_accumulation_steps and steps_per_generation times
    written / processes (the per-device memory unchanged), else, on more processes, the per-device batch sizes;
    None where no whole numbers do."""
    from fractions import Fraction

    ratio = Fraction(written, processes)
    micro, generation = values["per_device_train_batch_size"], values["generation_batch_size"]
    changes = [(name, values[name], values[name] * ratio) for name in ("gradient_accumulation_steps",
                                                                      "steps_per_generation") if values[name]]
    if all(new.denominator == 1 for *_, new in changes) and (not generation or generation % (micro * processes) == 0):
        return [(name, old, int(new)) for name, old, new in changes]
    if ratio < 1:  # more processes: smaller per-device batches (slurm_train.sh's fallback)
        changes = [(name, values[name], values[name] * ratio) for name in ("per_device_train_batch_size",
                                                                          "pef_batch_size") if values[name]]
        if all(new.denominator == 1 for *_, new in changes):
            return [(name, old, int(new)) for name, old, new in changes]
    return None


def recipe_batch(config: str | Path, argv: list[str], processes: int, config_cls=None) -> tuple[list[str], str]:
    """``(flags, note)`` for a run of the YAML ``config`` with the command line ``argv`` on ``processes`` processes.
    A YAML whose header states ``# processes: N`` (the paper recipes) keeps its global batch on another process
    count: ``flags`` are the rescaled batch fields to add to the command line (:func:`_rescaled`), ``note`` the line
    with the arithmetic to print. Nothing is rescaled when the header is absent or equal, when the command line
    sets a batch field itself (:data:`BATCH_FLAGS`; then ``note`` says so) or with ``--keep_recipe_batch false``
    (the per-device values as written; ``note`` gives the changed batch). Raises ValueError, with the arithmetic,
    the process counts that keep the batch and the ways out, where no whole numbers keep it (e.g. 8 -> 3)."""
    import yaml
    from trl import GRPOConfig

    written = recipe_processes(config)
    if written is None or written == processes:
        return [], ""
    path = Path(config)
    name = recipe_name(path) if path.resolve().is_relative_to(RECIPES_DIR) else str(config)
    head = (f"{name} is written for {written} process{'es' if written > 1 else ''}, this run has {processes}")
    given = [f"--{g}" for g in dict.fromkeys(_given(argv)) if g in BATCH_FLAGS]
    if given:
        return [], f"{head}: your batch flags ({' '.join(given)}) decide the batch, nothing is rescaled"
    raw = yaml.safe_load(path.read_text()) or {}
    values = _batch_values(raw, config_cls or GRPOConfig)
    micro, accumulation = values["per_device_train_batch_size"], values["gradient_accumulation_steps"]
    generation = values["generation_batch_size"]

    def batch(v: dict, p: int) -> tuple[int, int, int]:
        """(steps per generation, completions per optimizer step, completions per rollout batch) of v on p."""
        per_generation = v["steps_per_generation"] or (generation // (v["per_device_train_batch_size"] * p)
                                                       if generation else v["gradient_accumulation_steps"])
        device = v["per_device_train_batch_size"] * p
        return per_generation, device * v["gradient_accumulation_steps"], device * per_generation

    per_generation, step, rollout = batch(values, written)
    recipe = (f"{micro}/device x {written} processes x gradient_accumulation_steps {accumulation} = {step} "
              f"completions per optimizer step, x steps_per_generation {per_generation} = {rollout} per rollout batch")
    _, own_step, own_rollout = batch(values, processes) if not generation else (0, micro * processes * accumulation,
                                                                               generation)
    as_written = (f"--keep_recipe_batch false: the per-device values as written, {micro} x {processes} x "
                  f"{accumulation} = {own_step} completions per optimizer step (the recipe's {step}), {own_rollout} "
                  f"per rollout batch (the recipe's {rollout})")
    if not _keep_recipe_batch(argv, raw):
        return [], f"{head}: {as_written}"
    changes = _rescaled(values, written, processes)
    if changes is None:
        fits = [str(p) for p in range(1, 4 * written + 1) if _rescaled(values, written, p) is not None]
        tried = ", ".join(f"{field} {values[field]} x {written}/{processes} = {values[field] * written / processes:g}"
                          for field in ("gradient_accumulation_steps", "steps_per_generation",
                                        "per_device_train_batch_size") if values[field])
        raise ValueError(
            f"{head}, and no whole numbers keep its batch ({recipe}; {tried}). Fix: launch a process count that keeps "
            f"it ({', '.join(fits)}; --num_processes), or set the batch yourself with --per_device_train_batch_size / "
            f"--gradient_accumulation_steps / --steps_per_generation (docs/distributed.md), or pass {as_written}. "
            "Nothing was loaded")
    new = {**values, **{field: value for field, _, value in changes}}
    _, new_step, new_rollout = batch(new, processes)
    assert (new_step, new_rollout) == (step, rollout), (changes, step, rollout)
    flags = [a for field, _, value in changes for a in (f"--{field}", str(value))]
    what = " and ".join(f"{field} {old} -> {value}" for field, old, value in changes)
    note = (f"{head}: {what} keep{'s' if len(changes) == 1 else ''} its batch "
            f"({new['per_device_train_batch_size']}/device x {processes} process{'es' if processes > 1 else ''} x "
            f"{new['gradient_accumulation_steps']} = {step} completions per optimizer step, x "
            f"{batch(new, processes)[0]} = {rollout} per rollout batch); --keep_recipe_batch false keeps the "
            "per-device values as written")
    return flags, note

