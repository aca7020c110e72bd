"""Each paper recipe on 2 nodes, launched by ``scripts/slurm_train.sh`` as a SLURM job launches it, against the same
recipe on 1 node with 2 processes.

    python scripts/check_multinode.py [--trainers erpo eepo dph apo] [--backends ddp zero2 zero3 fsdp2]
    python scripts/check_multinode.py --resume   # ... checkpointed on 2 nodes inside a rollout, resumed on 2 nodes
                                                 # and on 1 node x 2 processes
    python scripts/check_multinode.py --preempt  # ... stopped by a SIGTERM to slurm_train.sh, resumed on 2 nodes

There is no cluster here, so the two "nodes" are two machines of one rendezvous on this one: ``slurm_train.sh`` runs
unchanged (its recipe reading, batch arithmetic, multi-node accelerate config and one ``accelerate launch
--machine_rank $SLURM_PROCID`` per node), with ``trainers_tests/distributed/fake_slurm/srun`` standing in for srun
(it starts the node tasks here, each with its own ``SLURM_PROCID``) and 2 nodes x 1 process (``GPUS_PER_NODE=1``).
Each node gets its own offline-pass cache (``TRL_VARIANTS_CACHE``, as on node-local scratch). What a real cluster adds
(NCCL over a network, GPUs, a shared file system that is really another machine's) is not here; what differs between
nodes for the code (``--num_machines``/``--machine_rank``, two processes that are each their node's first, per-node
caches) is. Each recipe runs through its ``# smoke:`` command with the tiny model and the embedded task substituted
(as ``check_distributed_backends.py --paper``), in its own precision, 32-token completions, 3 steps (``--resume``: 4,
a checkpoint every step, 2 steps per rollout). Writes ``results/distributed/multinode{,_resume}.{json,md}``.
About 20 (``--resume``: 30) minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from check_distributed_backends import (  # noqa: E402  (the other distributed checks' launch and table helpers)
    BIN,
    TIMING,
    merged,
    paper_command,
    param_cell,
    prompts_per_step,
    run,
    saved,
    write_table,
)

FAKE_SLURM = ROOT / "trainers_tests" / "distributed" / "fake_slurm"
ONE_NODE = {"ddp": "multi_cpu", "zero2": "zero2", "zero3": "zero3", "fsdp2": "fsdp2"}
# the accelerate config of a multi-node job: the multi-node forms of zero2/zero3 (what slurm_train.sh picks for a
# recipe launched with zero2.yaml); DDP and FSDP2 have none, and their single-node files serve (the launcher's
# --num_machines / --machine_rank / --main_process_ip override the file's)
MULTI_NODE = {"ddp": "multi_cpu", "zero2": "multi_node_zero2", "zero3": "multi_node_zero3", "fsdp2": "fsdp2"}


def split_command(cmd: list[str], method: str) -> tuple[Path, list[str]]:
    """The recipe copy and the training flags of a :func:`paper_command` (what follows the example script)."""
    flags = cmd[cmd.index(str(ROOT / "examples" / f"train_{method}.py")) + 1:]
    recipe = Path(flags[flags.index("--config") + 1])
    return recipe, flags[:flags.index("--config")] + flags[flags.index("--config") + 2:]


def one_node(method: str, backend: str, port: int, tmp: Path, flags: list[str]) -> tuple[list[str], dict]:
    """The recipe on 1 node x 2 processes (``check_distributed_backends.paper_command``)."""
    tmp.mkdir(parents=True, exist_ok=True)
    return paper_command(method, ONE_NODE[backend], port, tmp, flags)


def two_nodes(method: str, backend: str, port: int, tmp: Path, flags: list[str]) -> tuple[list[str], dict]:
    """The recipe on 2 nodes x 1 process through ``scripts/slurm_train.sh`` with the stand-in srun. The recipe copy
    sits in a folder named after the method (the launcher picks ``examples/train_<folder>.py``)."""
    tmp.mkdir(parents=True, exist_ok=True)
    cmd, env = paper_command(method, ONE_NODE[backend], port, tmp, flags)
    recipe, argv = split_command(cmd, method)
    env.update(PATH=f"{FAKE_SLURM}:{BIN}:{os.environ['PATH']}", SLURM_JOB_NODELIST="127.0.0.1,localhost",
               GPUS_PER_NODE="1", MAIN_PROCESS_PORT=str(port), PYTHON=sys.executable,
               ACCELERATE_CONFIG=str(ROOT / "configs" / "accelerate" / f"{MULTI_NODE[backend]}.yaml"),
               FAKE_SRUN_NODE_LOCAL="TRL_VARIANTS_CACHE")
    return ["bash", str(ROOT / "scripts" / "slurm_train.sh"), str(recipe), *argv], env


def two_nodes_run(method: str, backend: str, tmp: Path, name: str, port: int, output: Path, flags: list[str],
                  preempt_at: int | None) -> tuple[list[str], dict]:
    """Run ``name`` of a ``--preempt`` row (``check_preemption.preempt_and_resume``) on 2 nodes, into ``output``; the
    run to preempt exports the batch script's own pid (bash execs it), which the preempting reward signals."""
    from check_preemption import preempt_env, preempt_flags

    cmd, env = two_nodes(method, backend, port, tmp / name / method,
                         [*preempt_flags(method), "--output_dir", str(output), *flags])
    if preempt_at is not None:
        cmd = ["bash", "-c", 'export PREEMPT_PID=$$; exec "$@"', "bash", *cmd]
    return cmd, preempt_env(env, preempt_at)


def compare_runs(a: Path, b: Path, step: int) -> dict:
    """Largest parameter difference of two runs' final models, and largest relative difference of what they logged
    (``checkpoint-<step>/trainer_state.json``: both nodes print the log, the state has it once)."""
    import torch  # noqa: F401  (safetensors.torch needs it)
    from safetensors.torch import load_file

    wa, wb = (load_file(str(d / "model.safetensors")) for d in (a, b))
    out = {"max_param_diff": max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa if k in wb)}
    la, lb = (json.loads((d / f"checkpoint-{step}" / "trainer_state.json").read_text())["log_history"]
              for d in (a, b))
    la, lb = ([h for h in log if "loss" in h] for log in (la, lb))  # the steps (the summary's averages differ)
    worst, where = 0.0, None
    for ha, hb in zip(la[-len(lb):], lb, strict=True):  # a resumed run logs the steps after its checkpoint
        for key, va in ha.items():
            if key not in TIMING and isinstance(va, float | int):
                diff = abs(va - hb.get(key, float("nan"))) / max(1e-6, abs(va))
                if not diff <= worst:
                    worst, where = diff, f"step {ha.get('step')} {key}"
    out.update(max_metric_rel_diff=worst, at=where, steps_compared=len(lb))
    return out


def said_once(log: Path) -> bool:
    """The run's last line was printed once, by the process that saved (not also by the second node's first)."""
    return log.read_text().count("model saved to") == 1


def check_nodes(args, out: Path) -> None:
    work = out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    rows, port = [], 30100
    for method in args.trainers:
        for backend in args.backends:
            with tempfile.TemporaryDirectory() as tmp:
                tmp = Path(tmp)
                dirs = {"1x2": tmp / "one", "2x1": tmp / "two"}
                row = {"trainer": method, "backend": backend, "error": ""}
                start = time.time()
                for layout, launch in (("1x2", one_node), ("2x1", two_nodes)):
                    port += 1
                    flags = ["--max_steps", "3", "--dataset_train_split", "train[:32]", "--logging_steps", "1",
                             "--save_strategy", "steps", "--save_steps", "3", "--output_dir", str(dirs[layout])]
                    cmd, env = launch(method, backend, port, tmp / layout / method, flags)
                    log = work / f"multinode-{method}-{backend}-{layout}.log"
                    ok, error = run(cmd, env, log, timeout=900, cwd=ROOT, finished=saved)
                    row[f"ran_{layout}"] = ok
                    row["error"] = row["error"] or (f"{layout}: {error}" if error else "")
                    if layout == "2x1" and ok:
                        row["said_once"] = said_once(log)
                if row["ran_1x2"] and row["ran_2x1"]:
                    row.update(compare_runs(dirs["1x2"], dirs["2x1"], 3))
                row["seconds"] = round(time.time() - start)
            rows.append(row)
            print(json.dumps(row), flush=True)
    rows = merged(out / "multinode.json", rows)
    write_table(out / "multinode.md", "Each paper recipe on 2 nodes (scripts/slurm_train.sh) vs 1 node, 2 processes "
                "each", "", "2 machines x 1 process in one rendezvous on this CPU "
                "machine, launched by scripts/slurm_train.sh with a stand-in srun (one offline-pass cache per node), "
                "against `accelerate launch --num_processes 2` on one; the recipe's smoke command with the tiny model, "
                "its own precision, 3 steps.", rows,
                {"1 node x 2": lambda r: "yes" if r["ran_1x2"] else "no",
                 "2 nodes x 1": lambda r: "yes" if r["ran_2x1"] else "no",
                 "max parameter diff": param_cell,
                 "max relative metric diff (steps)": lambda r: (f"{r['max_metric_rel_diff']:.2g} "
                                                                f"({r['steps_compared']})"
                                                                if "max_metric_rel_diff" in r else ""),
                 "last line printed once": lambda r: r.get("said_once", ""),
                 "seconds": lambda r: r["seconds"]}, script="check_multinode.py")


def check_nodes_resume(args, out: Path) -> None:
    """``--resume``: 4 steps on 2 nodes with a checkpoint every step and 2 steps per rollout; new processes resume
    from checkpoint-3 (inside the second rollout) on 2 nodes, and on 1 node x 2 processes; each resumed run's final
    weights and logged steps against the uninterrupted run's."""
    work = out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    rows, port = [], 30300
    for method in args.trainers:
        prompts = (8 if method == "dph" else 4) * prompts_per_step(method)  # DPH-RL's offline pass moves some to D_pef
        for backend in args.backends:
            with tempfile.TemporaryDirectory() as tmp:
                tmp = Path(tmp)
                first = tmp / "first"
                common = ["--max_steps", "4", "--steps_per_generation", "2", "--dataset_train_split",
                          f"train[:{prompts}]", "--logging_steps", "1", "--save_strategy", "steps", "--save_steps", "1"]
                row = {"trainer": method, "backend": backend, "error": "", "prompts": prompts}
                start = time.time()
                port += 1
                cmd, env = two_nodes(method, backend, port, tmp / "first" / method,
                                     [*common, "--output_dir", str(first)])
                ok, error = run(cmd, env, work / f"multinode-resume-{method}-{backend}-first.log", timeout=900,
                                cwd=ROOT, finished=saved)
                row["ran"], row["error"] = ok, error
                if ok:
                    checkpoint = first / "checkpoint-3"
                    row["rollouts_in_checkpoint"] = len(list(checkpoint.glob("rollout_*.pt")))
                    for layout, launch in (("2x1", two_nodes), ("1x2", one_node)):
                        port += 1
                        resumed = tmp / f"resumed-{layout}"
                        cmd, env = launch(method, backend, port, tmp / layout / method,
                                          [*common, "--output_dir", str(resumed), "--resume_from_checkpoint",
                                           str(checkpoint)])
                        ok_r, error = run(cmd, env, work / f"multinode-resume-{method}-{backend}-{layout}.log",
                                          timeout=900, cwd=ROOT, finished=saved)
                        row[f"resumed_{layout}"] = ok_r
                        row["error"] = row["error"] or (f"resume on {layout}: {error}" if error else "")
                        if ok_r:
                            row[f"diff_{layout}"] = compare_runs(first, resumed, 4)
                row["seconds"] = round(time.time() - start)
            rows.append(row)
            print(json.dumps(row), flush=True)
    write_resume_table(merged(out / "multinode_resume.json", rows), out)


def write_resume_table(rows: list[dict], out: Path) -> None:
    def diff(layout):
        def cell(r):
            d = r.get(f"diff_{layout}")
            if d is None:
                return "yes" if r.get(f"resumed_{layout}") else ("no" if r.get("ran") else "")
            return f"yes: {d['max_param_diff']:.2g} / {d['max_metric_rel_diff']:.2g}"
        return cell

    write_table(out / "multinode_resume.md", "Each paper recipe checkpointed on 2 nodes inside a rollout, resumed on 2 "
                "nodes and on 1 node x 2 processes", "--resume", "4 steps on 2 nodes x 1 process "
                "(scripts/slurm_train.sh, a stand-in srun, one offline-pass cache per node), a checkpoint every step, "
                "2 steps per rollout; new processes resume from checkpoint-3, inside the second rollout, and train "
                "step 4. Each resumed cell: max parameter diff of the final weights / max relative diff of every "
                "logged number (trainer_state.json), against the uninterrupted run.", rows,
                {"ran on 2 nodes": lambda r: "yes" if r["ran"] else "no",
                 "rollouts in checkpoint-3": lambda r: r.get("rollouts_in_checkpoint", ""),
                 "resumed on 2 nodes": diff("2x1"), "resumed on 1 node x 2": diff("1x2"),
                 "seconds": lambda r: r["seconds"]}, script="check_multinode.py")


def check_nodes_preempt(args, out: Path) -> None:
    """``--preempt``: each recipe on 2 nodes with ``--enable_jit_checkpoint true``, uninterrupted; stopped by a SIGTERM
    to ``scripts/slurm_train.sh`` itself during step 3 (as ``#SBATCH --signal=B:TERM@<s>`` signals the batch script,
    which passes it to the training step: the stand-in srun hands it to each node's ``accelerate launch``); and
    resumed on 2 nodes (``--resume_from_checkpoint true``): the resumed run's weights against the uninterrupted run's."""
    from check_preemption import PREEMPT_COLUMNS, preempt_rows

    rows = preempt_rows(args, out, "multinode-preempt", two_nodes_run, 30700)
    write_table(out / "multinode_preempt.md", "Each paper recipe on 2 nodes stopped by a SIGTERM to slurm_train.sh, "
                "and resumed on 2 nodes", "--preempt", "6 steps, a rollout of 2 steps, `--enable_jit_checkpoint true`, "
                "2 nodes x 1 process (scripts/slurm_train.sh, a stand-in srun); the SIGTERM goes to the batch script "
                "during step 3 (as `#SBATCH --signal=B:TERM@<s>`), which passes it to the training step.",
                merged(out / "multinode_preempt.json", rows), PREEMPT_COLUMNS, script="check_multinode.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainers", nargs="+", default=["erpo", "eepo", "dph", "apo"])
    parser.add_argument("--backends", nargs="+", default=list(ONE_NODE), choices=list(ONE_NODE))
    parser.add_argument("--resume", action="store_true", help="instead: checkpoint on 2 nodes, resume on 2 and on 1")
    parser.add_argument("--preempt", action="store_true",
                        help="instead: a SIGTERM to slurm_train.sh during step 3, and the resume")
    parser.add_argument("--out", default=str(ROOT / "results" / "distributed"))
    args = parser.parse_args()
    (check_nodes_preempt if args.preempt else check_nodes_resume if args.resume else check_nodes)(args, Path(args.out))


if __name__ == "__main__":
    main()
