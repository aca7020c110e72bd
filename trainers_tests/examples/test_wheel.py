"""The package without a clone: a wheel built from this checkout, installed into a fresh venv,
trains every method offline from a directory outside the repo with nothing but ``trl-variants train <method>``.

The venv reuses this environment's dependencies without a network: a ``.pth`` file adds this environment's
site-packages after the venv's own. That directory holds the editable install's finder, but the finder is installed
by a ``.pth`` file of that directory, and the ``.pth`` files of a directory added by a ``.pth`` line are not read, so
the venv imports the wheel's copy (checked: where ``trl_variants`` is found in the venv).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
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
    ours = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    (Path(venv_site) / "_trl_variants_test_deps.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    env = Installed(root, wheel, venv)
    where = env.run(env.python, "-c", "import importlib.util; print(importlib.util.find_spec('trl_variants').origin)")
    assert where.returncode == 0, where.stderr[-3000:]
    assert Path(where.stdout.strip()).is_relative_to(venv), f"would import {where.stdout.strip()}, not the wheel's"
    return env


@pytest.fixture(scope="module")
def runs(installed) -> dict[str, subprocess.CompletedProcess]:
    """Every command of the tests below, run two at a time (two cores; the start-up, imports, dominates each):
    ``trl-variants train <method>`` on each embedded default (ERPO through ``accelerate launch -m trl_variants``,
    EEPO through ``accelerate launch $(which trl-variants)``, as the docs show them), ``trl-variants train --list``
    and ``python -m trl_variants --help``."""
    launch = [installed.python, "-m", "accelerate.commands.launch", "--num_processes", "1", "--mixed_precision", "no"]
    cli = installed.bin / "trl-variants"
    commands = {
        "erpo": [*launch, "-m", "trl_variants", "train", "erpo"],
        "eepo": [*launch, cli, "train", "eepo"],
        "dph": [cli, "train", "dph"],
        "apo": [cli, "train", "apo"],
    }
    commands = {m: [*c, *QUICK, *EXTRA.get(m, []), "--output_dir", installed.work / f"out-{m}"]
                for m, c in commands.items()}
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
