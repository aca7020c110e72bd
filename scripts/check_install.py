"""Resolve ``pip install trl-variants[<extra>]`` for no extra and for each extra, as a user's pip would.

    python scripts/check_install.py [--targets "" vllm deepspeed plots dev vllm,deepspeed] [--machine-pip-config]

For each target, ``pip install --dry-run --ignore-installed --report`` of this checkout resolves the whole dependency
tree from the package index (nothing is installed; pip reads each wheel's metadata file, so even vLLM's and torch's
CUDA wheels are not downloaded). By default pip runs without this machine's pip configuration (its local wheel folder
and its torch cap), so the resolution is the one a user with plain PyPI gets. The script then checks that every
declared requirement resolved inside its declared range and writes, under ``results/install/``:

* ``<target>.txt``: every resolved ``name==version`` (the target's lock, ``base.txt`` for no extra);
* ``resolved.json`` and ``resolved.md``: the versions of the packages that matter, the pip version, the time each
  resolution took, and the command.

Exit code 1 if a target does not resolve or resolves outside a declared range. About a minute per target.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "install"
TARGETS = ["", "vllm", "deepspeed", "plots", "dev", "vllm,deepspeed"]
SHOWN = ["torch", "transformers", "trl", "accelerate", "datasets", "peft", "tokenizers", "huggingface-hub",
         "math-verify", "vllm", "deepspeed", "matplotlib", "pytest"]


def declared_requirements(extras: list[str]) -> list[Requirement]:
    """The project's requirements for ``extras`` (from pyproject.toml), without environment markers."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        requirements += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return requirements


def pip_env(machine_config: bool) -> dict[str, str]:
    env = dict(os.environ)
    if not machine_config:  # plain PyPI: no pip.conf (local wheels, extra indexes, torch cap) and no find-links
        env["PIP_CONFIG_FILE"] = os.devnull
        for key in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_INDEX_URL"):
            env.pop(key, None)
    return env


def resolve(target: str, env: dict[str, str]) -> tuple[dict[str, str], float, str]:
    """``{canonical name: version}`` of the whole resolution of ``.[target]``, its time in seconds, and pip's log."""
    spec = f"{ROOT}[{target}]" if target else str(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--report", str(report), spec]
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            return {}, seconds, proc.stdout + proc.stderr
        installs = json.loads(report.read_text())["install"]
    versions = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}
    return versions, seconds, proc.stderr


def outside_ranges(versions: dict[str, str], extras: list[str]) -> list[str]:
    """Declared requirements whose resolved version is missing or outside the declared specifier."""
    problems = []
    for requirement in declared_requirements(extras):
        version = versions.get(canonicalize_name(requirement.name))
        if version is None:
            problems.append(f"{requirement.name} was not resolved")
        elif not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{requirement.name} {version} is outside the declared {requirement}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="*", default=TARGETS,
                        help='extras to resolve, one target each ("" = no extra; "vllm,deepspeed" = both)')
    parser.add_argument("--machine-pip-config", action="store_true",
                        help="resolve with this machine's pip configuration instead of plain PyPI")
    args = parser.parse_args()

    OUT.mkdir(parents=True, exist_ok=True)
    env = pip_env(args.machine_pip_config)
    pip_version = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True,
                                 env=env).stdout.split()[1]
    results, failed = {}, False
    for target in args.targets:
        extras = [e for e in target.split(",") if e]
        name = target.replace(",", "+") or "base"
        versions, seconds, log = resolve(target, env)
        problems = outside_ranges(versions, extras) if versions else ["did not resolve: " + log.strip()[-2000:]]
        failed |= bool(problems)
        if versions:
            lock = "".join(f"{n}=={v}\n" for n, v in sorted(versions.items()) if n != "trl-variants")
            (OUT / f"{name}.txt").write_text(f"# pip install --dry-run '.[{target}]' (pip {pip_version})\n" + lock)
        results[name] = {"extras": extras, "seconds": round(seconds, 1), "packages": len(versions),
                         "versions": {k: versions[k] for k in SHOWN if k in versions}, "problems": problems}
        print(f"[{name}] {len(versions)} packages in {seconds:.0f} s; "
              + ", ".join(f"{k} {v}" for k, v in results[name]["versions"].items())
              + ("".join(f"\n  PROBLEM: {p}" for p in problems)), flush=True)

    command = "python scripts/check_install.py" + (" --machine-pip-config" if args.machine_pip_config else "")
    record = {"command": command, "pip": pip_version, "python": sys.version.split()[0],
              "index": "this machine's pip config" if args.machine_pip_config else "PyPI only", "targets": results}
    (OUT / "resolved.json").write_text(json.dumps(record, indent=2) + "\n")
    shown = [k for k in SHOWN if any(k in r["versions"] for r in results.values())]
    lines = [
        "# `pip install trl-variants[<extra>]`: what resolves",
        "",
        f"Made by `{command}` (pip {pip_version}, Python {record['python']}, {record['index']}): "
        "`pip install --dry-run --ignore-installed --report` of the checkout for each target; every declared "
        "requirement was checked to resolve inside its declared range. Full locks: `<target>.txt` beside this file.",
        "",
        "| target | " + " | ".join(shown) + " | packages | seconds | inside ranges |",
        "|---" * (len(shown) + 4) + "|",
    ]
    for name, r in results.items():
        cells = [r["versions"].get(k, "") for k in shown]
        ok = "yes" if not r["problems"] else "NO: " + "; ".join(r["problems"])[:200]
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {r['packages']} | {r['seconds']} | {ok} |")
    (OUT / "resolved.md").write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
