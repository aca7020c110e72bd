"""Each paper recipe stopped by SIGTERM on 2 processes under each backend, and resumed: the checkpoint a preempted job
leaves (``enable_jit_checkpoint``, docs/reliability.md "Preemption") against the run uninterrupted.

    python scripts/check_preemption.py [--trainers erpo eepo dph apo] [--backends ddp zero2 zero3 fsdp2]

For each (recipe, backend), through ``accelerate launch`` as a user launches it (the recipe's smoke command with the
tiny model, its own precision, 32-token completions; ``check_distributed_backends.paper_command``), 6 steps with a
rollout of 2 steps and ``--enable_jit_checkpoint true``: the run uninterrupted; the same run with a SIGTERM to the
``accelerate launch`` process (as a scheduler signals a job) while step 3's rollout is scored (a reward of 0 added to
the recipe's, ``trainers_tests/reliability/test_preemption.py::preempting_zero_reward``, sends it from process 0);
and a third launch resumed from what the second left (``--resume_from_checkpoint true``). Records the step the run
stopped after, what its checkpoint holds, whether it saved a final model (it should not), and the resumed run's largest
parameter difference to the uninterrupted one. Writes ``results/distributed/preempt.{json,md}``. About 15 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from check_distributed_backends import (  # noqa: E402  (the other distributed checks' launch and table helpers)
    merged,
    paper_command,
    paper_recipe,
    param_cell,
    prompts_per_step,
    run,
    write_table,
)

BACKENDS = {"ddp": "multi_cpu", "zero2": "zero2", "zero3": "zero3", "fsdp2": "fsdp2"}
ZERO_REWARD = "trainers_tests.reliability.test_preemption.preempting_zero_reward"


def preempt_flags(method: str) -> list[str]:
    """The flags of every run of these checks: 6 steps, a rollout of 2 steps, two epochs' worth of prompts (DPH-RL's
    offline pass moves some to D_pef: twice as many), no scheduled save, the checkpoint on SIGTERM, and the recipe's
    rewards plus the preempting reward of 0."""
    prompts = (8 if method == "dph" else 4) * prompts_per_step(method)
    rewards = yaml.safe_load(paper_recipe(method).read_text())["reward_funcs"]
    return ["--max_steps", "6", "--steps_per_generation", "2", "--dataset_train_split", f"train[:{prompts}]",
            "--save_strategy", "no", "--enable_jit_checkpoint", "true", "--logging_steps", "1",
            "--reward_funcs", *rewards, ZERO_REWARD]


def preempt_env(env: dict, preempt_at: int | None) -> dict:
    """``env`` with the repository importable (the preempting reward lives in the suite) and ``PREEMPT_AT_STEP``
    set to ``preempt_at`` (removed for None)."""
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(ROOT)) if p)
    env.pop("PREEMPT_AT_STEP", None)
    if preempt_at is not None:
        env["PREEMPT_AT_STEP"] = str(preempt_at)
    return env


def launch(method: str, backend: str, port: int, tmp: Path, out: Path, flags: list[str], preempt_at: int | None):
    cmd, env = paper_command(method, BACKENDS[backend], port, tmp,
                             [*preempt_flags(method), "--output_dir", str(out), *flags])
    return cmd, preempt_env(env, preempt_at)


def check(args, out: Path) -> None:
    import torch  # noqa: F401  (safetensors.torch needs it)
    from safetensors.torch import load_file

    work = out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    rows, port = [], 30500
    for method in args.trainers:
        for backend in args.backends:
            row = {"trainer": method, "backend": backend, "error": ""}
            start = time.time()
            with tempfile.TemporaryDirectory() as tmp:
                tmp = Path(tmp)
                dirs = {name: tmp / name for name in ("whole", "run")}
                logs = {name: work / f"preempt-{method}-{backend}-{name}.log" for name in ("whole", "run", "resumed")}
                port += 3
                cmd, env = launch(method, backend, port, tmp, dirs["whole"], [], None)
                ok, error = run(cmd, env, logs["whole"], timeout=900, cwd=ROOT,
                                finished=lambda text: "model saved to" in text)
                row["ran"] = ok
                if ok:
                    cmd, env = launch(method, backend, port + 1, tmp, dirs["run"], [], 3)
                    _, error = run(cmd, env, logs["run"], timeout=900, cwd=ROOT, finished=lambda text: True)
                    text = logs["run"].read_text()
                    stopped = re.search(r"stopped by SIGTERM after step (\d+) of", text)
                    row["stopped_after"] = int(stopped.group(1)) if stopped else None
                    checkpoints = sorted(p.name for p in dirs["run"].glob("checkpoint-*"))
                    row["checkpoints"] = checkpoints
                    if checkpoints:
                        last = dirs["run"] / checkpoints[-1]
                        row["complete"] = (last / "trainer_state.json").exists()
                        row["rng_states"] = len(list(last.glob("rng_state_*.pth")))
                        row["rollouts"] = len(list(last.glob("rollout_*.pt")))
                    row["final_model_saved"] = (dirs["run"] / "model.safetensors").exists()
                    ok = stopped is not None and row.get("complete", False)
                    if not ok:
                        row["error"] = error or "no 'stopped by SIGTERM' line or no complete checkpoint"
                if ok:
                    cmd, env = launch(method, backend, port + 2, tmp, dirs["run"], ["--resume_from_checkpoint", "true"],
                                      None)
                    ok, error = run(cmd, env, logs["resumed"], timeout=900, cwd=ROOT,
                                    finished=lambda text: "model saved to" in text)
                    row["resumed"] = ok
                    row["error"] = error
                    if ok:
                        wa, wb = (load_file(str(d / "model.safetensors")) for d in (dirs["whole"], dirs["run"]))
                        row["max_param_diff"] = max((wa[k].float() - wb[k].float()).abs().max().item()
                                                    for k in wa if k in wb)
                elif not row["error"]:
                    row["error"] = error
            row["seconds"] = round(time.time() - start)
            rows.append(row)
            print(json.dumps(row), flush=True)
    rows = merged(out / "preempt.json", rows)
    write_table(out / "preempt.md", "Each paper recipe stopped by SIGTERM during step 3 on 2 processes, and resumed",
                "", "6 steps, a rollout of 2 steps, `--enable_jit_checkpoint true`; the SIGTERM goes to the `accelerate "
                "launch` process while step 3's rollout is scored; the resumed run (`--resume_from_checkpoint true`) "
                "against the uninterrupted one.", rows,
                {"stopped after step": lambda r: r.get("stopped_after", ""),
                 "checkpoints left": lambda r: ", ".join(r.get("checkpoints", [])),
                 "RNG states / rollouts in it": lambda r: (f"{r['rng_states']} / {r['rollouts']}"
                                                           if "rng_states" in r else ""),
                 "final model saved": lambda r: r.get("final_model_saved", ""),
                 "resumed": lambda r: "yes" if r.get("resumed") else ("no" if "resumed" in r else ""),
                 "max parameter diff to the uninterrupted run": param_cell,
                 "seconds": lambda r: r["seconds"]}, script="check_preemption.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainers", nargs="+", default=["erpo", "eepo", "dph", "apo"])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    parser.add_argument("--out", default=str(ROOT / "results" / "distributed"))
    check(parser.parse_args(), Path(parser.parse_args().out))


if __name__ == "__main__":
    main()
