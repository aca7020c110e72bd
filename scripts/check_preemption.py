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
import functools
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
    saved,
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


RUNS = ("whole", "run", "resumed")  # the three runs of a row, each on its own rendezvous port (the row's + index)


def one_node(method: str, backend: str, tmp: Path, name: str, port: int, output: Path, flags: list[str],
             preempt_at: int | None) -> tuple[list[str], dict]:
    """Run ``name`` of a row on 1 node x 2 processes (``accelerate launch``), into ``output``."""
    cmd, env = paper_command(method, BACKENDS[backend], port, tmp,
                             [*preempt_flags(method), "--output_dir", str(output), *flags])
    return cmd, preempt_env(env, preempt_at)


def preempt_and_resume(launch, port: int, tmp: Path, logs: dict) -> dict:
    """One (recipe, backend) of the preemption checks: the run uninterrupted (into ``tmp/whole``); the same run with
    a SIGTERM during step 3 (into ``tmp/run``): the step it stopped after, what its last checkpoint holds, whether it
    saved a final model (it should not); and the run resumed from what that left, its weights against the
    uninterrupted run's. ``launch(name, port, output_dir, flags, preempt_at)`` gives each run's command and
    environment (:func:`one_node`; two nodes: ``check_multinode.two_nodes_run``); ``logs[name]`` is its log."""
    import torch  # noqa: F401  (safetensors.torch needs it)
    from safetensors.torch import load_file

    whole, stopped_run = tmp / "whole", tmp / "run"
    row = {}
    name = "whole"
    cmd, env = launch(name, port, whole, [], None)
    ok, error = run(cmd, env, logs["whole"], timeout=900, cwd=ROOT, finished=saved)
    row["ran"] = ok
    if ok:
        name = "run"
        cmd, env = launch(name, port + 1, stopped_run, [], 3)
        _, error = run(cmd, env, logs["run"], timeout=900, cwd=ROOT, finished=lambda text: True)
        stopped = re.search(r"stopped by SIGTERM after step (\d+) of", logs["run"].read_text())
        row["stopped_after"] = int(stopped.group(1)) if stopped else None
        row["checkpoints"] = sorted(p.name for p in stopped_run.glob("checkpoint-*"))
        if row["checkpoints"]:
            last = stopped_run / row["checkpoints"][-1]
            row["complete"] = (last / "trainer_state.json").exists()
            row["rng_states"] = len(list(last.glob("rng_state_*.pth")))
            row["rollouts"] = len(list(last.glob("rollout_*.pt")))
        row["final_model_saved"] = (stopped_run / "model.safetensors").exists()
        ok = stopped is not None and row.get("complete", False)
        error = error or ("" if ok else "no 'stopped by SIGTERM' line or no complete checkpoint")
    if ok:
        name = "resumed"
        cmd, env = launch(name, port + 2, stopped_run, ["--resume_from_checkpoint", "true"], None)
        ok, error = run(cmd, env, logs["resumed"], timeout=900, cwd=ROOT, finished=saved)
        row["resumed"] = ok
        if ok:
            wa, wb = (load_file(str(d / "model.safetensors")) for d in (whole, stopped_run))
            row["max_param_diff"] = max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa if k in wb)
    row["error"] = f"{name}: {error}" if error else ""
    return row


def preempt_rows(args, out: Path, prefix: str, launcher, port: int) -> list[dict]:
    """Every (recipe, backend) of ``args`` through :func:`preempt_and_resume`, each run launched by ``launcher``
    (:func:`one_node`; two nodes: ``check_multinode.two_nodes_run``) with its logs under ``out/runs/<prefix>-...``;
    each row printed as it ends."""
    work = out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for method in args.trainers:
        for backend in args.backends:
            start = time.time()
            port += len(RUNS)
            logs = {name: work / f"{prefix}-{method}-{backend}-{name}.log" for name in RUNS}
            with tempfile.TemporaryDirectory() as tmp:
                launch = functools.partial(launcher, method, backend, Path(tmp))
                row = {"trainer": method, "backend": backend,
                       **preempt_and_resume(launch, port, Path(tmp), logs)}
            row["seconds"] = round(time.time() - start)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


# the columns of both preemption tables (this one's and check_multinode.py --preempt's)
PREEMPT_COLUMNS = {
    "stopped after step": lambda r: r.get("stopped_after", ""),
    "checkpoints left": lambda r: ", ".join(r.get("checkpoints", [])),
    "RNG states / rollouts in it": lambda r: f"{r['rng_states']} / {r['rollouts']}" if "rng_states" in r else "",
    "final model saved": lambda r: r.get("final_model_saved", ""),
    "resumed": lambda r: "yes" if r.get("resumed") else ("no" if "resumed" in r else ""),
    "max parameter diff to the uninterrupted run": param_cell,
    "seconds": lambda r: r["seconds"],
}


def check(args, out: Path) -> None:
    rows = merged(out / "preempt.json", preempt_rows(args, out, "preempt", one_node, 30500))
    write_table(out / "preempt.md", "Each paper recipe stopped by SIGTERM during step 3 on 2 processes, and resumed",
                "", "6 steps, a rollout of 2 steps, `--enable_jit_checkpoint true`; the SIGTERM goes to the `accelerate "
                "launch` process while step 3's rollout is scored; the resumed run (`--resume_from_checkpoint true`) "
                "against the uninterrupted one.", rows, PREEMPT_COLUMNS, script="check_preemption.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainers", nargs="+", default=["erpo", "eepo", "dph", "apo"])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    parser.add_argument("--out", default=str(ROOT / "results" / "distributed"))
    check(parser.parse_args(), Path(parser.parse_args().out))


if __name__ == "__main__":
    main()
