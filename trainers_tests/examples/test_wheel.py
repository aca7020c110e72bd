"""The package without a clone: a wheel built from this checkout, installed into a fresh venv,
trains every method offline from a directory outside the repo with nothing but ``trl-variants train <method>``, and
the README's first command (``trl-variants train erpo``, shortened) runs to its held-out curves.

The venv sees only the wheel's declared dependencies, without a network: their transitive closure (the
``Requires-Dist`` of the wheel's metadata and of each dependency, environment markers evaluated, no extras) is
read from this environment's ``importlib.metadata``, and a directory of symlinks to just those distributions'
top-level packages and ``.dist-info`` is added by a ``.pth`` file. What is installed here but not declared
(matplotlib, an extra) is invisible there, as after ``pip install trl-variants`` (checked), so a missing dependency
fails here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "trl_variants" / "recipes"
METHODS = ("erpo", "eepo", "dph", "apo")
# two steps of 2 prompts x 4 completions of 8 tokens, held-out evaluation and checkpoints off: the start-up dominates
QUICK = ["--max_steps", "2", "--embedded_train_size", "16", "--embedded_test_size", "4",
         "--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "8",
         "--torch_threads", "1", "--heldout_eval_steps", "0", "--save_strategy", "no", "--logging_steps", "1"]
EXTRA = {"dph": ["--num_presamples", "4", "--pef_threshold", "4", "--pef_batch_size", "2"],
         "apo": ["--num_generations", "1", "--num_value_samples", "4"]}  # (the later --num_generations wins)

pytestmark = pytest.mark.slow


class Installed:
    def __init__(self, root: Path, wheel: Path, venv: Path):
        self.root, self.wheel, self.venv = root, wheel, venv
        self.bin = venv / "bin"
        self.python = self.bin / "python"
        self.work = root / "work"  # the cwd of every command: outside the repo, no configs/ or examples/ there
        self.work.mkdir()
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        self.env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                        TRL_VARIANTS_CACHE=str(root / "cache"), VIRTUAL_ENV=str(venv),
                        PATH=f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}")

    def run(self, *argv, timeout: int = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(a) for a in argv], cwd=self.work, env=self.env, capture_output=True, text=True,
                              timeout=timeout)


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def link_declared_dependencies(wheel: Path, target: Path) -> set[str]:
    """Symlink into ``target`` the top-level packages, modules and ``.dist-info`` of every distribution of this
    environment in the transitive closure of ``wheel``'s requirements (markers evaluated, no extras); returns the
    distributions' names. A top-level name several distributions share (a namespace package) is linked once."""
    from email.parser import Parser
    from importlib import metadata

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as zf:
        meta = Parser().parsestr(zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode())
    pending, seen = list(meta.get_all("Requires-Dist") or []), set()
    target.mkdir(parents=True)
    while pending:
        req = Requirement(pending.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if _name(req.name) in seen:
            continue
        seen.add(_name(req.name))
        dist = metadata.distribution(req.name)  # declared but not installed here: the test cannot build the env
        pending += dist.requires or []
        for top in {Path(f).parts[0] for f in dist.files or [] if Path(f).parts[0] not in ("..", "__pycache__")}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (target / top).exists() and not top.endswith(".pth"):
                (target / top).symlink_to(source)
    return seen


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    # the checkout's build inputs (top-level files and the package), copied so the build writes nothing in the tree
    src = root / "src"
    src.mkdir()
    for path in ROOT.iterdir():
        if path.is_file() and not path.is_symlink() and not path.name.startswith("."):
            shutil.copy2(path, src / path.name)
    shutil.copytree(ROOT / "trl_variants", src / "trl_variants", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = root / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(dist), str(src)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = dist.glob("trl_variants-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                              "--no-deps", "--no-index", "-q", str(wheel)], capture_output=True, text=True,
                             timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    venv_site = subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip()
    # named site-packages like a real install's: dill (datasets' fingerprints) treats modules under such a path as
    # installed ones, and fails to pickle pyarrow's types from anywhere else
    deps = root / "declared" / "site-packages"
    linked = link_declared_dependencies(wheel, deps)
    assert {"trl", "torch", "transformers"} <= linked and "matplotlib" not in linked, sorted(linked)
    (Path(venv_site) / "_trl_variants_test_deps.pth").write_text(f"{deps}\n")
    env = Installed(root, wheel, venv)
    where = env.run(env.python, "-c", "import importlib.util; print(importlib.util.find_spec('trl_variants').origin)")
    assert where.returncode == 0, where.stderr[-3000:]
    assert Path(where.stdout.strip()).is_relative_to(venv), f"would import {where.stdout.strip()}, not the wheel's"
    return env


@pytest.fixture(scope="module")
def runs(installed) -> dict[str, subprocess.CompletedProcess]:
    """Every command of the tests below, run two at a time (two cores; the start-up, imports, dominates each):
    ``trl-variants train <method>`` on each embedded default (ERPO as the README's first command, with its held-out
    evaluation every step, DPH-RL through ``accelerate launch -m trl_variants``, EEPO through ``accelerate launch
    $(which trl-variants)``, as the docs show them), ``trl-variants train --list``, ``python -m trl_variants --help``
    and whether matplotlib imports."""
    launch = [installed.python, "-m", "accelerate.commands.launch", "--num_processes", "1", "--mixed_precision", "no"]
    cli = installed.bin / "trl-variants"
    commands = {
        "erpo": [cli, "train", "erpo"],  # the README's first command
        "eepo": [*launch, cli, "train", "eepo"],
        "dph": [*launch, "-m", "trl_variants", "train", "dph"],
        "apo": [cli, "train", "apo"],
    }
    commands = {m: [*c, *QUICK, *EXTRA.get(m, []), "--output_dir", installed.work / f"out-{m}"]
                for m, c in commands.items()}
    commands["erpo"] += ["--heldout_eval_steps", "1", "--embedded_test_size", "8"]  # (the later value wins)
    commands["matplotlib"] = [installed.python, "-c", "import matplotlib"]
    commands["list"] = [cli, "train", "--list"]
    commands["help"] = [installed.python, "-m", "trl_variants", "--help"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(commands, pool.map(lambda argv: installed.run(*argv), commands.values()), strict=True))


def test_the_wheel_holds_every_recipe_and_accelerate_config(installed):
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    shipped = sorted(p.relative_to(ROOT).as_posix() for p in RECIPES.glob("*/*.yaml"))
    assert len(shipped) >= 19 and {p.split("/")[2] for p in shipped} >= {*METHODS, "grpo", "accelerate"}
    missing = [p for p in shipped if p not in names]
    assert not missing, f"not in the wheel: {missing}"
    assert not [n for n in names if n.startswith(("configs/", "examples/"))]  # the package is all it needs


def test_installed_cli_lists_the_shipped_recipes_and_runs_as_a_module(installed, runs):
    listing = runs["list"]
    assert listing.returncode == 0, listing.stderr[-3000:]
    assert f"in {installed.venv}" in listing.stdout  # the installed copies, not the checkout's
    for method in (*METHODS, "grpo"):
        assert f"  {method}/tiny_cpu " in listing.stdout
    for name in ("erpo/qwen2.5-math-7b", "eepo/qwen2.5-3b", "dph/qwen2.5-math-7b", "apo/qwen2.5-7B",
                 "accelerate/zero2"):
        assert f"  {name} " in listing.stdout
    helped = runs["help"]
    assert helped.returncode == 0, helped.stderr[-3000:]
    assert "  train " in helped.stdout and "accelerate launch -m trl_variants train erpo" in helped.stdout


@pytest.mark.parametrize("method", METHODS)
def test_installed_package_trains_offline_outside_the_repo(installed, runs, method):
    proc = runs[method]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained on 1 process(es)" in proc.stdout
    out = installed.work / f"out-{method}"
    assert (out / "model.safetensors").stat().st_size > 1_000_000 and (out / "README.md").exists()


def test_the_readme_first_command_reaches_its_heldout_curves_with_only_the_declared_dependencies(installed, runs):
    assert runs["matplotlib"].returncode != 0, "matplotlib (not a declared dependency) is visible in the venv"
    proc = runs["erpo"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = installed.work / "out-erpo"
    assert json.loads((out / "heldout.json").read_text())["history"]  # the numbers are kept
    assert "plots skipped: matplotlib is not installed (pip install 'trl-variants[plots]')" in proc.stdout
