"""Every trainer on 2 processes under each shipped Accelerate backend config, compared with plain DDP.

    python scripts/check_distributed_backends.py [--trainers erpo eepo dph apo] [--backends zero2 zero3 fsdp2]
    python scripts/check_distributed_backends.py --resume [--trainers erpo eepo dph apo dph_peft]  # resume from a
                                                         # checkpoint under each backend (and DDP)
    python scripts/check_distributed_backends.py --heldout  # with held-out evaluation during training
    python scripts/check_distributed_backends.py --recipes  # each method's example script and tiny recipe
    python scripts/check_distributed_backends.py --paper    # each method's paper recipe in bf16
    python scripts/check_distributed_backends.py --paper --resume  # ... resumed inside its second epoch
    python scripts/check_distributed_backends.py --paper --resume --backends fsdp2_sharded  # FSDP2 checkpointing
                                                         # each process's shard (--fsdp_state_dict_type SHARDED_STATE_DICT)

Runs ``trainers_tests/distributed/harness.py`` (3 optimizer steps, fixed global batch and completions) with
``torchrun`` (gloo DDP, the reference) and with ``accelerate launch --config_file configs/accelerate/<backend>.yaml
--num_processes 2 --mixed_precision no`` (float32: DeepSpeed does not take float64 models), on CPU (FSDP2 over gloo:
the harness lifts Accelerate's GPU-only gate for FSDP, ``harness._fsdp_on_cpu``), and writes
``results/distributed/backends.{json,md}``: for each (trainer, backend) whether it ran, the largest parameter and
relative metric differences to DDP, and for a run that failed the last line of its error. About 15 minutes on 2 cores.
``--heldout``: the same runs with held-out evaluation during training (``HARNESS_HELDOUT``), written to
``results/distributed/heldout.{json,md}``: what each evaluation measured, and from which weights, against DDP's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the suite's harness and recipe helpers (--paper builds the smoke command with them)
HARNESS = ROOT / "trainers_tests" / "distributed" / "harness.py"
BIN = Path(sys.executable).parent
TIMING = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second",
          "offline_pass/seconds"}


def harness_ok(text: str) -> bool:
    return text.count("OK") >= 2  # the two ranks' "OK r" lines may interleave


def run(cmd, env, log: Path, timeout: int = 1500, finished=harness_ok, cwd=None) -> tuple[bool, str]:
    """Run ``cmd`` with its output in ``log``: whether it exited 0 and ``finished(output)`` says so, and otherwise the
    last error line. A run past ``timeout`` (a hang) is a failure of its own; the sweep goes on."""
    with open(log, "w") as f:
        try:
            proc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, cwd=cwd)
        except subprocess.TimeoutExpired:
            return False, f"timed out after {timeout} s (a hang?)"
    text = log.read_text()
    if proc.returncode == 0 and finished(text):
        return True, ""
    errors = [line for line in text.splitlines() if line.startswith("[rank0]:") and "Error" in line]
    errors = errors or [line for line in text.splitlines() if "Error" in line]
    return False, (errors[-1] if errors else text.strip().splitlines()[-1])[:400]


def compare(ref: Path, other: Path, skip: frozenset = frozenset()) -> dict:
    import torch  # noqa: F401  (safetensors.torch needs it)
    from safetensors.torch import load_file

    la, lb = (json.loads((d / "log_history.json").read_text()) for d in (ref, other))
    worst, where = 0.0, None
    for ha, hb in zip(la, lb, strict=True):
        for key, va in ha.items():
            if key in TIMING or key in skip:
                continue
            diff = abs(va - hb[key]) / max(1e-6, abs(va))
            if diff > worst:
                worst, where = diff, f"step {ha.get('step')} {key}"
    wa, wb = load_file(str(ref / "model.safetensors")), load_file(str(other / "model.safetensors"))
    return {"max_param_diff": max((wa[k] - wb[k]).abs().max().item() for k in wa),
            "max_metric_rel_diff": worst, "at": where}


def merged(path: Path, rows: list[dict]) -> list[dict]:
    """``rows`` with the rows of ``path`` for the (trainer, backend) pairs not run this time, in a fixed order; written
    back to ``path``."""
    if path.exists():
        ran = {(r["trainer"], r["backend"]) for r in rows}
        rows = [r for r in json.loads(path.read_text()) if (r["trainer"], r["backend"]) not in ran] + rows
    trainers = {"erpo": 0, "eepo": 1, "dph": 2, "apo": 3, "dph_peft": 4}
    backends = {"ddp (reference)": 0, "ddp": 0, "zero2": 1, "zero3": 2, "fsdp2": 3, "fsdp2_sharded": 4}
    rows.sort(key=lambda r: (trainers.get(r["trainer"], 9), r["trainer"], backends.get(r["backend"], 9)))
    path.write_text(json.dumps(rows, indent=1))
    return rows


def write_table(path: Path, title: str, flag: str, note: str, rows: list[dict], columns: dict,
                script: str = "check_distributed_backends.py") -> None:
    """``path``: a markdown table of ``rows``, one column per (header, cell function) of ``columns`` between the
    trainer and backend and the error; printed too."""
    command = f"python scripts/{script}{' ' + flag if flag else ''}"
    lines = [f"# {title}", "", f"Made by `{command}` ({time.strftime('%Y-%m-%d')}); see docs/distributed.md."
             + (f" {note}" if note else ""), "",
             "| " + " | ".join(["trainer", "backend", *columns, "error"]) + " |", "|---" * (len(columns) + 3) + "|"]
    for r in rows:
        cells = [str(cell(r)) for cell in columns.values()]
        lines.append("| " + " | ".join([r["trainer"], r["backend"], *cells, r["error"].replace("|", "/")]) + " |")
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def param_cell(row: dict) -> str:
    return f"{row['max_param_diff']:.2g}" if "max_param_diff" in row else ""


def metric_cell(row: dict) -> str:
    if "max_metric_rel_diff" not in row:
        return ""
    return f"{row['max_metric_rel_diff']:.2g}" + (f" ({row['at']})" if row["at"] else "")


def launch_cmd(backend: str, port: int, trainer: str, run_dir: Path) -> list[str]:
    if backend == "ddp":
        return [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(port), str(HARNESS), trainer,
                str(run_dir)]
    return [str(BIN / "accelerate"), "launch", "--config_file", str(ROOT / "configs" / "accelerate" / f"{backend}.yaml"),
            "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(port), str(HARNESS),
            trainer, str(run_dir)]


def check_resume(args, out: Path) -> None:
    """``--resume``: under each backend (and DDP), a run that checkpoints every step, and a second run, in new
    processes, resumed from its checkpoint at step 2: the resumed run's step 3 and final weights against the first's.
    AdamW, whose moments the checkpoint must carry (plain SGD has no optimizer state to resume)."""
    work = out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HARNESS_DTYPE="float32",
               HARNESS_OPTIM="adamw_torch")
    rows, port = [], 29760
    for trainer in args.trainers:
        for backend in ["ddp", *args.backends]:
            first, resumed = work / f"{trainer}-{backend}-checkpoints", work / f"{trainer}-{backend}-resumed"
            run_env = dict(env, ACCELERATE_USE_CPU="1") if backend == "ddp" else env
            start = time.time()
            port += 1
            ok, error = run(launch_cmd(backend, port, trainer, first), dict(run_env, HARNESS_CHECKPOINTS="1"),
                            work / f"{first.name}.log")
            if ok:
                port += 1
                checkpoint = first / "trainer" / "checkpoint-2"
                ok, error = run(launch_cmd(backend, port, trainer, resumed), dict(run_env, HARNESS_RESUME=str(checkpoint)),
                                work / f"{resumed.name}.log")
            row = {"trainer": trainer, "backend": backend, "resumed": ok, "error": error,
                   "seconds": round(time.time() - start)}
            if ok:  # transformers' summary train_loss averages the steps this run trained (the resumed run: step 3)
                row.update(compare(first, resumed, skip=frozenset({"train_loss"})))
                # a run that ignored the checkpoint and trained from step 0 would end the same: count its steps
                row["steps_run_resumed"] = json.loads((resumed / "rank0.json").read_text())["steps_run"]
            rows.append(row)
            print(json.dumps(row), flush=True)
            for run_dir in (first, resumed):  # the checkpoints (hundreds of MB); logs and final weights stay
                shutil.rmtree(run_dir / "trainer", ignore_errors=True)
    rows = merged(out / "resume.json", rows)
    write_table(out / "resume.md", "A run resumed from its step-2 checkpoint against the same run uninterrupted, 2 CPU "
                "processes", "--resume", "3 steps, AdamW, float32; the resumed run starts new processes.", rows,
                {"resumed": lambda r: "yes" if r["resumed"] else "no",
                 "steps the resumed run trained": lambda r: r.get("steps_run_resumed", ""),
                 "max parameter diff to the uninterrupted run": param_cell,
                 "max relative metric diff": metric_cell})


def heldout_cells(observed: dict, ref_observed: dict) -> dict:
    """``--heldout``: how each process's held-out evaluations compare with the DDP run's: the number of weights the
    sampling model held (the full model under ZeRO-3 / FSDP), the largest relative difference of the sum of their
    magnitudes, and whether the measured numbers (greedy accuracy, mean sampled length) are identical."""
    mine, ref = observed.get("heldout", []), ref_observed.get("heldout", [])
    if len(mine) != len(ref) or not ref:
        return {"evaluations": len(mine), "heldout_equal": False}
    pairs = list(zip(mine, ref, strict=True))
    return {"evaluations": len(mine), "full_weights": all(a["numel"] == b["numel"] for a, b in pairs),
            "weights_rel_diff": max(abs(a["abs_sum"] - b["abs_sum"]) / b["abs_sum"] for a, b in pairs),
            "heldout_equal": all((a["greedy"], a["mean_length"]) == (b["greedy"], b["mean_length"]) for a, b in pairs)}


def compare_backends(args, out: Path, heldout: bool) -> None:
    """Each trainer under each backend against DDP (``heldout``: with held-out evaluation during training, on every
    process of each run)."""
    work = out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HARNESS_DTYPE="float32")
    if heldout:
        env["HARNESS_HELDOUT"] = "1"
    tag = "-heldout" if heldout else ""
    rows, port = [], 29700
    for trainer in args.trainers:
        ref = work / f"{trainer}-ddp{tag}"
        port += 1
        start = time.time()
        ok, error = run(launch_cmd("ddp", port, trainer, ref), dict(env, ACCELERATE_USE_CPU="1"),
                        work / f"{ref.name}.log")
        rows.append({"trainer": trainer, "backend": "ddp (reference)", "ran": ok, "error": error,
                     "seconds": round(time.time() - start)})
        for backend in args.backends:
            port += 1
            run_dir = work / f"{trainer}-{backend}{tag}"
            start = time.time()
            ok_b, error = run(launch_cmd(backend, port, trainer, run_dir), env, work / f"{run_dir.name}.log")
            row = {"trainer": trainer, "backend": backend, "ran": ok_b, "error": error,
                   "seconds": round(time.time() - start)}
            if ok_b:
                observed = json.loads((run_dir / "rank0.json").read_text())
                row["distributed_type"] = observed["distributed_type"]
                if ok:
                    row.update(compare(ref, run_dir))
                    ref_observed = json.loads((ref / "rank0.json").read_text())
                    if heldout:
                        row.update(heldout_cells(observed, ref_observed))
                        row["ranks_agree"] = observed["heldout"] == json.loads(
                            (run_dir / "rank1.json").read_text())["heldout"]
                    elif "offline_pass_digest" in observed:
                        row["offline_pass_equal"] = observed["offline_pass_digest"] == ref_observed.get(
                            "offline_pass_digest")
            rows.append(row)
            print(json.dumps(row), flush=True)
    ran = lambda r: "yes" if r["ran"] else "no"  # noqa: E731
    if heldout:
        rows = merged(out / "heldout.json", rows)
        write_table(out / "heldout.md", "Held-out evaluation during training under each backend, 2 CPU processes, vs "
                    "gloo DDP", "--heldout", "HeldOutCallback on 6 prompts (greedy and 2 samples at T = 3) before "
                    "training, at step 2 and at the end; each run's processes share out its chunks.", rows,
                    {"ran": ran, "evaluations": lambda r: r.get("evaluations", ""),
                     "sampled from the full weights": lambda r: r.get("full_weights", ""),
                     "weights' relative diff to DDP's": lambda r: (f"{r['weights_rel_diff']:.2g}"
                                                                   if "weights_rel_diff" in r else ""),
                     "held-out numbers identical to DDP's": lambda r: r.get("heldout_equal", ""),
                     "both processes measured the same": lambda r: r.get("ranks_agree", ""),
                     "max parameter diff to DDP": param_cell})
        return
    rows = merged(out / "backends.json", rows)
    write_table(out / "backends.md", "Every trainer under each Accelerate backend, 2 CPU processes, vs gloo DDP", "",
                "", rows, {"ran": ran, "backend in use": lambda r: r.get("distributed_type", ""),
                           "max parameter diff to DDP": param_cell, "max relative metric diff": metric_cell,
                           "offline pass identical to DDP's": lambda r: r.get("offline_pass_equal", "")})


RECIPE_METHODS = ["erpo", "eepo", "dph", "apo", "composed", "grpo"]


def check_recipes(args, out: Path) -> None:
    """``--recipes``: each method's example script with its tiny recipe (what the README runs), as a user launches it
    under DDP (configs/accelerate/multi_cpu.yaml) and each backend: 2 processes, 3 steps, held-out evaluation before
    training, at step 2 and at the end. Records whether it ran, the backend its first line names, the held-out greedy
    accuracy before and after, and a failed run's error. The harness runs fix the completions to compare numbers;
    these run the recipes' own settings (temperature 1, completions of any length, EEPO's "auto" gate)."""
    work = out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    rows, port = [], 29800
    methods = args.trainers or RECIPE_METHODS
    for method in methods:
        for backend in ["multi_cpu", *args.backends]:
            port += 1
            run_dir = work / f"recipe-{method}-{backend}"
            shutil.rmtree(run_dir, ignore_errors=True)
            env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
            device = []
            if backend.startswith("fsdp"):  # FSDP over gloo on a machine without a GPU: the harness's lift
                env["PYTHONPATH"] = str(HARNESS.parent / "fsdp_on_cpu")
                device = ["--use_cpu", "false"]
            cmd = [str(BIN / "accelerate"), "launch", "--config_file", str(ROOT / "configs" / "accelerate" /
                   f"{backend}.yaml"), "--num_processes", "2", "--mixed_precision", "no", "--main_process_port",
                   str(port), str(ROOT / "examples" / f"train_{method}.py"), "--max_steps", "3",
                   "--heldout_eval_steps", "2", "--embedded_test_size", "8", "--embedded_train_size", "64",
                   "--output_dir", str(run_dir), "--report_to", "none", "--save_strategy", "no", "--bf16", "false",
                   "--logging_steps", "1", *device]
            start = time.time()
            log = work / f"{run_dir.name}.log"
            ok, error = run(cmd, env, log, timeout=900, finished=lambda _, d=run_dir: (d / "heldout.json").exists(),
                            cwd=ROOT)
            row = {"trainer": method, "backend": "ddp" if backend == "multi_cpu" else backend,
                   "ran": ok, "seconds": round(time.time() - start), "error": error}
            first = [line for line in log.read_text().splitlines() if line.startswith("training on ")]
            row["runs_as"] = first[0].removeprefix("training on ") if first else ""
            if ok:
                history = json.loads((run_dir / "heldout.json").read_text())["history"]
                row["heldout_greedy"] = [h["greedy"] for h in history]
                row["heldout_steps"] = [h["step"] for h in history]
            shutil.rmtree(run_dir, ignore_errors=True)  # the saved model and its card; the log stays
            rows.append(row)
            print(json.dumps(row), flush=True)
    rows = merged(out / "recipes.json", rows)
    write_table(out / "recipes.md", "Each method's tiny recipe (examples/train_<method>.py) under each backend, 2 CPU "
                "processes", "--recipes", "3 steps, held-out evaluation on 8 prompts before training, at step 2 and at "
                "the end; the recipes' own sampling settings.", rows,
                {"ran": lambda r: "yes" if r["ran"] else "no", "runs as (its first line)": lambda r: r["runs_as"],
                 "held-out greedy (steps)": lambda r: (" -> ".join(f"{g:.3f}" for g in r["heldout_greedy"])
                                                       + f" ({', '.join(map(str, r['heldout_steps']))})")
                 if "heldout_greedy" in r else "",
                 "seconds": lambda r: r["seconds"]})


PAPER_RECIPE = {"erpo": "qwen2.5-math-7b", "eepo": "qwen2.5-3b", "dph": "qwen2.5-math-7b", "apo": "qwen2.5-1.5B"}
# what each method adds, logged at step 1: the number to compare across backends
PAPER_METRIC = {"erpo": "erpo/query_kl", "eepo": "eepo/unlearning_loss", "dph": "dph/loss_exp", "apo": "apo/regression_loss"}


def moved_tensors(saved: Path) -> tuple[int, int, float]:
    """How many of the saved model's tensors differ from where training started, of how many, and the largest change.
    The start is the tiny model's float32 weights, or those rounded to bf16 (a recipe's ``dtype: bfloat16`` load):
    a tensor counts as moved when it differs from both."""
    import torch
    from safetensors.torch import load_file

    from trl_variants.default import DEFAULT_MODEL_PATH

    start, end = load_file(str(Path(DEFAULT_MODEL_PATH) / "model.safetensors")), load_file(str(saved))
    changes = [min((start[k].to(dtype).float() - end[k].float()).abs().max().item()
                   for dtype in (torch.float32, torch.bfloat16)) for k in start if k in end]
    return sum(c > 0 for c in changes), len(changes), max(changes)


def paper_recipe(method: str) -> Path:
    return ROOT / "configs" / method / f"{PAPER_RECIPE[method]}.yaml"


def saved(text: str) -> bool:
    """An example script's run reached its end (its last line)."""
    return "model saved to" in text


def smoke_flags(recipe: Path) -> dict[str, str]:
    """The ``--flag value`` pairs of a recipe's ``# smoke:`` command (the last value of each)."""
    from trainers_tests.examples.test_recipe_start import smoke_argv

    return flag_values(smoke_argv(recipe))


def prompts_per_step(method: str) -> int:
    """Prompts per optimizer step of ``method``'s paper-recipe smoke command on 2 processes (its
    per_device_train_batch_size on each, ``num_generations`` completions per prompt)."""
    import yaml

    generations = yaml.safe_load(paper_recipe(method).read_text())["num_generations"]
    return max(1, 2 * int(smoke_flags(paper_recipe(method))["--per_device_train_batch_size"]) // generations)


def flag_values(argv: list[str]) -> dict[str, str]:
    """The ``--flag value`` pairs of ``argv`` (the last value of each)."""
    return {a: b for a, b in zip(argv, argv[1:], strict=False) if a.startswith("--")}


def paper_command(method: str, backend: str, port: int, tmp: Path, flags: list[str],
                  processes: int = 2) -> tuple[list[str], dict]:
    """``accelerate launch`` of ``method``'s paper recipe (``PAPER_RECIPE``) in its own precision under ``backend``
    on 2 CPU processes: its ``# smoke:`` command with the tiny model and the embedded task substituted (the suite's
    ``test_recipe_start.cpu_smoke_argv``, which copies the recipe into ``tmp``), 32-token completions, then
    ``flags``. Returns the command and its environment (presample cache under ``tmp``)."""
    import yaml

    from trainers_tests.examples.test_recipe_start import cpu_smoke_argv  # the suite's CPU stand-ins

    recipe = paper_recipe(method)
    own = yaml.safe_load(recipe.read_text())
    precision = ["--bf16", str(own.get("bf16", False)).lower(), "--dtype", str(own.get("dtype", "float32")),
                 "--gradient_checkpointing", str(own.get("gradient_checkpointing", False)).lower()]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRL_VARIANTS_CACHE=str(tmp / "cache"))
    if backend.startswith("fsdp"):  # FSDP over gloo on a machine without a GPU: the harness's lift
        env["PYTHONPATH"] = str(HARNESS.parent / "fsdp_on_cpu")
    launcher = []
    if backend == "fsdp2_sharded":  # fsdp2.yaml checkpointing each process's shard (FSDP2's default state dict)
        backend, launcher = "fsdp2", ["--fsdp_state_dict_type", "SHARDED_STATE_DICT"]
    cmd = [str(BIN / "accelerate"), "launch", "--config_file", str(ROOT / "configs" / "accelerate" / f"{backend}.yaml"),
           "--num_processes", str(processes), "--main_process_port", str(port), *launcher,
           str(ROOT / "examples" / f"train_{method}.py"),
           *cpu_smoke_argv(recipe, tmp), *precision, "--max_completion_length", "32", "--torch_threads", "1", *flags]
    return cmd, env


def extra_names(stem: str, flag: str, extra: str) -> tuple[str, str]:
    """The result file's stem and the command's flags with ``--extra`` (``paper`` -> ``paper_<flags>``)."""
    if not extra:
        return stem, flag
    return stem + "_" + re.sub(r"[^a-z0-9]+", "_", extra.lower()).strip("_"), f"{flag} --extra={shlex.quote(extra)}"


def same_batch_on(processes: int, smoke: dict[str, str], extra: str) -> list[str]:
    """The batch flags that keep the smoke command's global batch (2 processes) on ``processes``: 1 doubles
    ``gradient_accumulation_steps`` and ``steps_per_generation``, 4 halves ``per_device_train_batch_size``."""
    given = {**smoke, **flag_values(shlex.split(extra))}
    if processes == 2:
        return []
    if processes == 1:
        return [flag for name in ("--gradient_accumulation_steps", "--steps_per_generation")
                for flag in (name, str(2 * int(given.get(name, 1))))]
    if processes == 4:
        return ["--per_device_train_batch_size", str(int(given["--per_device_train_batch_size"]) // 2)]
    raise SystemExit(f"--resume_processes {processes}: 1, 2 or 4")


def check_paper_resume(args, out: Path) -> None:
    """``--paper --resume``: each paper recipe in its own precision (:func:`paper_command`) under DDP and each backend,
    on a dataset of two rollout batches (an epoch is 2 steps), 4 steps with a checkpoint every step; then new processes
    resume from the first checkpoint inside the second epoch (a row fails without one), and their final weights and
    step-4 loss are set against the uninterrupted run's. (The float32 ``--resume`` runs stay inside the first
    epoch.) ``--extra`` adds flags to both runs: ``--extra="--steps_per_generation 2"`` makes a rollout 2 steps, so
    the checkpoint is inside a rollout as well (each process's ``rollout_<i>.pt``). ``--resume_processes 1`` (or 4)
    resumes on that many processes with the same global batch (:func:`same_batch_on`): not bit for bit (each process
    samples with its own random state), so the table says whether it ran and the first step's loss instead of the
    weight difference; DeepSpeed refuses it by name."""
    import tempfile

    import torch  # noqa: F401  (safetensors.torch needs it)
    from safetensors.torch import load_file

    work = out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    rows, port = [], 29950
    for method in args.trainers:
        # two rollout batches of the smoke command's (its per_device_train_batch_size on 2 processes); DPH-RL's offline
        # pass moves some of them to D_pef, so it gets twice as many and 6 steps
        smoke = smoke_flags(paper_recipe(method))
        per_step = prompts_per_step(method)
        prompts, steps = (4 * per_step, 6) if method == "dph" else (2 * per_step, 4)
        for backend in ["multi_cpu", *args.backends]:
            with tempfile.TemporaryDirectory() as tmp:
                first, resumed = Path(tmp) / "first", Path(tmp) / "resumed"
                common = ["--max_steps", str(steps), "--dataset_train_split", f"train[:{prompts}]",
                          *shlex.split(args.extra)]
                start = time.time()
                port += 2
                cmd, env = paper_command(method, backend, port, Path(tmp), [
                    *common, "--output_dir", str(first), "--save_strategy", "steps", "--save_steps", "1"])
                log_first = work / f"paper-resume-{method}-{backend}-first.log"
                ok, error = run(cmd, env, log_first, timeout=900, cwd=ROOT, finished=saved)
                inside = None
                if ok:  # the first checkpoint inside the second epoch (1 < epoch < 2)
                    epochs = {n: json.loads((first / f"checkpoint-{n}" / "trainer_state.json").read_text())["epoch"]
                              for n in range(1, steps)}
                    inside = next((n for n, e in epochs.items() if 1 < e < 2), None)
                    if inside is None:
                        ok, error = False, f"no checkpoint inside the second epoch (epoch at each: {epochs})"
                if ok:
                    cmd, env = paper_command(method, backend, port + 1, Path(tmp), [
                        *common, "--output_dir", str(resumed), "--resume_from_checkpoint",
                        str(first / f"checkpoint-{inside}"), *same_batch_on(args.resume_processes, smoke, args.extra)],
                        processes=args.resume_processes)
                    log_resumed = work / f"paper-resume-{method}-{backend}-resumed.log"
                    ok, error = run(cmd, env, log_resumed, timeout=900, cwd=ROOT,
                                    finished=saved)
                row = {"trainer": method, "backend": "ddp" if backend == "multi_cpu" else backend, "resumed": ok,
                       "prompts": prompts, "seconds": round(time.time() - start), "error": error,
                       "resume_processes": args.resume_processes}
                if ok:
                    wa, wb = (load_file(str(d / "model.safetensors")) for d in (first, resumed))
                    # a tied lm_head is saved by some layouts and not others (FSDP2 on 2 processes vs 1)
                    row["max_param_diff"] = max((wa[k].float() - wb[k].float()).abs().max().item()
                                                for k in wa if k in wb)
                    steps_a, steps_b = _logged_steps(log_first.read_text()), _logged_steps(log_resumed.read_text())
                    row["loss_last"] = [steps_a[-1]["loss"], steps_b[-1]["loss"]] if steps_a and steps_b else []
                    row["checkpoint"], row["epoch_at_checkpoint"] = inside, epochs[inside]
                    row["rollouts_in_checkpoint"] = len(list((first / f"checkpoint-{inside}").glob("rollout_*.pt")))
            rows.append(row)
            print(json.dumps(row), flush=True)
    stem, flag = extra_names("paper_resume", "--paper --resume", args.extra)
    if args.resume_processes != 2:
        stem, flag = f"{stem}_on_{args.resume_processes}", f"{flag} --resume_processes {args.resume_processes}"
    rows = merged(out / f"{stem}.json", rows)
    moved = (f" The resumed run has {args.resume_processes} process(es) and the same global batch (1: twice the "
             "gradient_accumulation_steps and steps_per_generation; 4: half the per_device_train_batch_size): its "
             "completions are sampled anew, so its weights and losses differ from the uninterrupted run's; DeepSpeed "
             "refuses it by name." if args.resume_processes != 2 else "")
    write_table(out / f"{stem}.md", "Each paper recipe in bf16 resumed inside its second epoch, 2 CPU processes"
                + (f", resumed on {args.resume_processes}" if args.resume_processes != 2 else "")
                + (f", with {args.extra}" if args.extra else ""), flag,
                "A dataset of two batches of prompts per optimizer step (an epoch is 2 steps), 4 steps (DPH-RL: four "
                "batches before its split, 6 steps), a checkpoint every step; new processes resume from the first "
                "checkpoint inside the second epoch and end with the run. 'Rollouts in the checkpoint': how many "
                "processes saved the rollout they were inside (0 where the checkpoint falls between rollouts)."
                + moved, rows,
                {"resumed": lambda r: "yes" if r["resumed"] else "no",
                 "resumed from (its epoch)": lambda r: (f"checkpoint-{r['checkpoint']} ({r['epoch_at_checkpoint']})"
                                                        if "checkpoint" in r else ""),
                 "rollouts in the checkpoint": lambda r: r.get("rollouts_in_checkpoint", ""),
                 "max parameter diff to the uninterrupted run": param_cell,
                 "last step's loss (uninterrupted / resumed)": lambda r: " / ".join(map(str, r.get("loss_last", []))),
                 "seconds": lambda r: r["seconds"]})


def check_paper_recipes(args, out: Path) -> None:
    """``--paper``: each method's paper recipe in its own precision (``dtype: bfloat16``, ``bf16: true``, gradient
    checkpointing), as a cluster user launches it under DDP (multi_cpu.yaml), ZeRO-2, ZeRO-3 and FSDP2 with bf16
    mixed precision: 2 CPU processes, 3 steps at the recipe's learning rate, through the recipe's ``# smoke:`` command
    with the tiny model and the embedded task substituted (``test_recipe_start.cpu_smoke_argv``), 32 prompts (the
    smoke command's batch on each process) and 32-token completions (enough for some rewards). Records whether it ran, its first line, the step-1 loss and the method's
    own number (``PAPER_METRIC``), and how many weight tensors the 3 steps moved at the recipe's 1e-6 / 2e-7 / 5e-7."""
    import tempfile

    work = out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    rows, port = [], 29900
    for method in args.trainers:
        recipe = paper_recipe(method)
        for backend in ["multi_cpu", *args.backends]:
            port += 1
            name = f"paper-{method}-{backend}" + ("-extra" if args.extra else "")
            with tempfile.TemporaryDirectory() as tmp:
                run_dir = Path(tmp) / "out"
                cmd, env = paper_command(method, backend, port, Path(tmp), [
                    "--max_steps", "3", "--dataset_train_split", "train[:32]",  # 2 processes: twice the smoke batch
                    "--output_dir", str(run_dir), *shlex.split(args.extra)])
                start = time.time()
                log = work / f"{name}.log"
                ok, error = run(cmd, env, log, timeout=900, cwd=ROOT, finished=saved)
                row = {"trainer": method, "backend": "ddp" if backend == "multi_cpu" else backend, "ran": ok,
                       "recipe": f"configs/{method}/{recipe.name}", "seconds": round(time.time() - start),
                       "error": error}
                text = log.read_text()
                first = [line for line in text.splitlines() if line.startswith("training on ")]
                row["runs_as"] = first[0].removeprefix("training on ") if first else ""
                row["upcast"] = "in float32 instead of" in text  # the master-weights rule's line
                if ok:
                    history = _logged_steps(text)  # (the smoke command saves no checkpoint: no trainer_state)
                    row["step1"] = {k: history[0][k] for k in ("loss", "grad_norm", PAPER_METRIC[method])
                                    if history and k in history[0]}
                    row["moved"], row["tensors"], row["max_change"] = moved_tensors(run_dir / "model.safetensors")
            rows.append(row)
            print(json.dumps(row), flush=True)
    stem, flag = extra_names("paper", "--paper", args.extra)
    rows = merged(out / f"{stem}.json", rows)
    write_table(out / f"{stem}.md", "Each method's paper recipe in bf16 under each backend, 2 CPU processes"
                + (f", with {args.extra}" if args.extra else ""), flag,
                "The recipe's own precision (bf16 policy, bf16 compute, gradient checkpointing) and learning rate, "
                "through its smoke command with the tiny model and the embedded task, 32-token completions, 3 steps.",
                rows, {"ran": lambda r: "yes" if r["ran"] else "no", "runs as (its first line)": lambda r: r["runs_as"]
                       + (" (policy loaded in float32: no master copy)" if r["upcast"] else ""),
                       "step 1: loss / grad norm / the method's number": lambda r: " / ".join(
                           f"{k} {float(v):.4g}" for k, v in r.get("step1", {}).items()),
                       "weight tensors moved in 3 steps (largest change)": lambda r: (
                           f"{r['moved']}/{r['tensors']} ({r['max_change']:.2g})" if "moved" in r else ""),
                       "seconds": lambda r: r["seconds"]})


def _logged_steps(text: str) -> list[dict]:
    """The training log lines transformers prints (``{'loss': ...}``), parsed, in order."""
    import ast

    return [ast.literal_eval(line[line.index("{'loss'"):line.index("}", line.index("{'loss'")) + 1])
            for line in text.splitlines() if "{'loss'" in line]


DEFAULT_TRAINERS = ["erpo", "eepo", "dph", "apo"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainers", nargs="+", default=None,
                        help=f"default: {' '.join(DEFAULT_TRAINERS)} (--recipes: {' '.join(RECIPE_METHODS)})")
    parser.add_argument("--backends", nargs="+", default=["zero2", "zero3", "fsdp2"])
    parser.add_argument("--resume", action="store_true",
                        help="instead: resume from a checkpoint under each backend (results/distributed/resume.md)")
    parser.add_argument("--heldout", action="store_true",
                        help="with held-out evaluation during training in every run (results/distributed/heldout.md)")
    parser.add_argument("--recipes", action="store_true",
                        help="instead: each method's tiny recipe through its example script, under DDP and each "
                             "backend (results/distributed/recipes.md; --trainers names methods, default all six)")
    parser.add_argument("--paper", action="store_true",
                        help="instead: each method's paper recipe in bf16 (its smoke command, the tiny model), under "
                             "DDP and each backend with bf16 mixed precision (results/distributed/paper.md)")
    parser.add_argument("--extra", default="", help="--paper: more flags for every run (written to "
                                                     "paper_<flags>.md or paper_resume_<flags>.md), e.g. "
                                                     "--extra=\"--cast_lm_head_to_fp32 true\"")
    parser.add_argument("--resume_processes", type=int, default=2,
                        help="--paper --resume: resume on this many processes (1 or 4; the same global batch), "
                             "written to paper_resume_on_<n>.md")
    parser.add_argument("--out", default=str(ROOT / "results" / "distributed"))
    args = parser.parse_args()
    out = Path(args.out)
    if args.recipes:
        check_recipes(args, out)
        return
    args.trainers = args.trainers or DEFAULT_TRAINERS
    if args.paper:
        (check_paper_resume if args.resume else check_paper_recipes)(args, out)
        return
    if args.resume:
        check_resume(args, out)
        return
    compare_backends(args, out, args.heldout)


if __name__ == "__main__":
    main()
