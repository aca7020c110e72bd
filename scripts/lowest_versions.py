"""Build a venv at the lowest versions pyproject.toml allows and run the config tests there.

    python scripts/lowest_versions.py                        # the lower bounds: results/install/lowest.md
    python scripts/lowest_versions.py --name vllm_set --pins-from results/install/vllm.txt

The constraints file pins every declared runtime requirement that has a lower bound to exactly that bound
(``transformers>=5.0`` -> ``transformers==5.0``); the rest of the tree resolves as pip likes. ``--pins-from`` pins
the declared requirements (and huggingface-hub) to the versions of a lock written by ``scripts/check_install.py``
instead, e.g. the ``[vllm]`` resolution, whose vLLM caps transformers (vLLM itself, a CUDA build, is not installed).
torch is not a declared requirement: the venv gets ``--torch`` (default ``torch==2.13.0``, the CPU build this
machine's pip has on disk; PyPI's other Linux builds are CUDA builds of several GB).

The venv lives outside the repo (``--venv``, default ``$TMPDIR/trl_variants_<name>``, rebuilt each run). In it the
script runs ``pytest trainers_tests/examples/test_configs.py test_multinode.py`` (every shipped YAML through the
examples' parser and batch arithmetic, the accelerate configs through accelerate's loader, the SLURM launcher's
commands) and a 2-step ERPO run of ``examples/train_erpo.py`` with ``configs/erpo/tiny_cpu.yaml`` (64 prompts), then
writes ``results/install/<name>.md`` (versions, commands, outputs) and ``<name>_freeze.txt``. Exit code 1 if
anything fails. Several minutes, mostly pip downloads.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "install"
SHOWN = ["torch", "transformers", "trl", "accelerate", "datasets", "peft", "tokenizers", "huggingface-hub",
         "math-verify", "safetensors", "tqdm", "pytest"]


def declared() -> list[Requirement]:
    return [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]


def lower_bound_pins() -> list[str]:
    """``name==bound`` for each declared requirement with a ``>=`` (or ``==``) bound."""
    pins = []
    for requirement in declared():
        bounds = [s.version for s in requirement.specifier if s.operator in (">=", "==", "~=")]
        if bounds:
            pins.append(f"{requirement.name}=={bounds[0]}")
    return pins


def lock_pins(lock: Path) -> list[str]:
    """The declared requirements' (and huggingface-hub's) versions in a ``name==version`` lock file."""
    wanted = {canonicalize_name(r.name) for r in declared()} | {"huggingface-hub"}
    pins = []
    for line in lock.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            if canonicalize_name(name) in wanted:
                pins.append(f"{name}=={version}")
    return pins


def run(cmd: list[str], log: list[str], **kwargs) -> subprocess.CompletedProcess:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    shown = " ".join(str(c) for c in cmd).replace(str(ROOT) + "/", "").replace(str(ROOT), ".")
    log.append(f"$ {shown}   # exit {proc.returncode}, {time.perf_counter() - start:.0f} s")
    return proc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="lowest", help="name of the venv and of the result files")
    parser.add_argument("--pins-from", type=Path, help="a lock of scripts/check_install.py to pin instead")
    parser.add_argument("--venv", type=Path, help="where to build the venv (outside the repo)")
    parser.add_argument("--torch", default="torch==2.13.0", help="the torch requirement installed first")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that creates the venv")
    args = parser.parse_args()

    venv = args.venv or Path(tempfile.gettempdir()) / f"trl_variants_{args.name}"
    if venv.resolve().is_relative_to(ROOT):
        parser.error(f"--venv {venv} is inside the repo; pass a directory outside it")
    pins = lock_pins(args.pins_from) if args.pins_from else lower_bound_pins()
    shutil.rmtree(venv, ignore_errors=True)
    log: list[str] = []
    start = time.perf_counter()
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_HUB_DISABLE_TELEMETRY="1", PYTHONDONTWRITEBYTECODE="1")
    python = venv / "bin" / "python"
    constraints = venv / "constraints.txt"

    steps_ok = run([args.python, "-m", "venv", str(venv)], log).returncode == 0
    constraints.write_text("".join(p + "\n" for p in pins))
    install = [
        [str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"],
        [str(python), "-m", "pip", "install", "-q", args.torch],
        # the package itself, pinned by the constraints; pytest for the tests (not a runtime requirement)
        [str(python), "-m", "pip", "install", "-q", "-c", str(constraints), "-e", str(ROOT), "pytest"],
    ]
    for cmd in install:
        if steps_ok:
            proc = run(cmd, log, env=env)
            steps_ok = proc.returncode == 0
            if not steps_ok:  # pip's answer without its notes about this machine's empty local indexes
                text = [line for line in (proc.stdout + proc.stderr).splitlines() if "WARNING: Location" not in line]
                log.append("\n".join(text)[-3000:])
    freeze = run([str(python), "-m", "pip", "freeze"], log, env=env).stdout if steps_ok else ""
    installed = {canonicalize_name(line.split("==")[0]): line.split("==")[1]
                 for line in freeze.splitlines() if "==" in line}
    mismatched = [p for p in pins if Version(installed.get(canonicalize_name(p.split("==")[0]), "0"))
                  != Version(p.split("==")[1])]
    if steps_ok and mismatched:
        log.append(f"pins not installed as asked: {mismatched}")
        steps_ok = False

    outputs = {}
    if steps_ok:
        tests = run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                     "trainers_tests/examples/test_configs.py", "trainers_tests/examples/test_multinode.py"],
                    log, cwd=ROOT, env=env)
        outputs["config tests"] = tests
        with tempfile.TemporaryDirectory() as tmp:
            train = run([str(python), "examples/train_erpo.py", "--config", "configs/erpo/tiny_cpu.yaml",
                         "--max_steps", "2", "--output_dir", tmp, "--report_to", "none", "--save_strategy", "no",
                         "--logging_steps", "1", "--embedded_train_size", "64", "--torch_threads", "1"], log, cwd=ROOT, env=env)
        outputs["2-step ERPO run"] = train
    ok = steps_ok and all(p.returncode == 0 for p in outputs.values())
    minutes = (time.perf_counter() - start) / 60

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}_freeze.txt").write_text(freeze)
    command = "python scripts/lowest_versions.py" + (f" --name {args.name} --pins-from "
                                                     f"{args.pins_from.resolve().relative_to(ROOT)}"
                                                     if args.pins_from else "")
    lines = [
        f"# Config tests in a venv at {'the lower bounds' if not args.pins_from else 'the versions of ' + args.pins_from.name}: "
        f"{'PASSED' if ok else 'FAILED'}",
        "",
        f"Made by `{command}` ({minutes:.1f} min, Python {sys.version.split()[0]}). Constraints (pinned exactly):",
        "",
        "```",
        *pins,
        "```",
        "",
        "Installed: " + ", ".join(f"{k} {installed[k]}" for k in SHOWN if k in installed)
        + f" (full list: `{args.name}_freeze.txt`).",
        "",
        "Commands:",
        "",
        "```",
        *log,
        "```",
    ]
    for title, proc in outputs.items():
        text = (proc.stdout + proc.stderr).strip().splitlines()
        if title == "2-step ERPO run":  # the training logs and the last lines; the rest is progress bars
            text = [t for t in text if t.startswith("{")] + text[-5:]
        lines += ["", f"## {title}: exit {proc.returncode}", "", "```", *text[-60:], "```"]
    (OUT / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:4] + log))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
