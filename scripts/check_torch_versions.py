"""Run the test suite under several torch versions and write what passed: ``results/install/torch_versions.md``;
with ``--with``, under other versions of other packages: ``results/install/package_versions.md``.

    python scripts/check_torch_versions.py                          # 2.6.0 and 2.15.0, the whole suite (~20 min each)
    python scripts/check_torch_versions.py --versions 2.11.0 --tests trainers_tests/distributed
    python scripts/check_torch_versions.py --with transformers==5.17.0,huggingface-hub==1.33.0   # the [vllm] extra's
    python scripts/check_torch_versions.py --from-logs              # only rebuild the tables from the kept logs

torch is not a declared requirement of this package (docs/install.md). transformers 5 disables itself below torch
2.6, so 2.6 is the lowest torch a user can have; a plain ``pip install trl-variants`` resolves to the newest (2.15.0
on 2026-11-28); CI tests 2.13.0 (``scripts/setup_env.sh``); the GPU machines in results/gpu ran 2.11.0. Each version
runs through ``scripts/test_with_torch.sh`` (a venv ``.venv-torch<version>`` with PyPI's wheel of that torch over
``.venv``'s other packages, made once), with the README's test command's offline settings and 2 workers. The log of
each run is kept as ``results/install/torch/<version>.log``; the table lists each version's pytest summary line,
its wall time and the tests that failed. ``--with`` runs ``scripts/test_with.sh`` with each comma-separated set of
requirements instead (logs in ``results/install/with/``), e.g. the transformers and huggingface-hub that
``pip install "trl-variants[vllm]"`` resolves to (``results/install/vllm.txt``).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "install"
LOGS = OUT / "torch"
WITH_LOGS = OUT / "with"
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed).*) in ([\d.]+)s")


def run_logged(command: list[str], log_path: Path) -> None:
    """``command``, its output (after the command line and the commit) in ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"{log_path.stem}: {' '.join(command)}", flush=True)
    start = time.time()
    with open(log_path, "w") as log:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
        log.write(f"$ {' '.join(command)}\n# commit {commit}\n")
        log.flush()
        rc = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
        log.write(f"\nexit code {rc}, {time.time() - start:.0f} s in all (venv included)\n")


def run_version(version: str, tests: list[str]) -> None:
    """The suite (or ``tests``) under torch ``version``; its output goes to the version's log."""
    run_logged(["bash", "scripts/test_with_torch.sh", version, *tests, "-n", "2", "-q", "--timeout", "900"],
               LOGS / f"{version}.log")


def run_with(requirements: str, tests: list[str]) -> None:
    """The suite (or ``tests``) with ``requirements`` (comma-separated pip requirements) over .venv's packages."""
    name = re.sub(r"[^A-Za-z0-9.]+", "_", requirements.replace("==", "-")).strip("_")
    run_logged(["bash", "scripts/test_with.sh", requirements, *tests, "-n", "2", "-q", "--timeout", "900"],
               WITH_LOGS / f"{name}.log")


def summarize(log: Path) -> dict:
    """The version's row: its pytest summary, wall time and failed tests, read from its log."""
    lines = log.read_text().splitlines()
    versions = [line.split()[1:3] for line in lines[:40] if line.startswith(("test_with: ", "test_with_torch: "))]
    summary = next(filter(None, (SUMMARY.match(line.strip("= ")) for line in reversed(lines))), None)
    failed = sorted({line.split()[1] for line in lines if line.startswith(("FAILED ", "ERROR "))})
    commit = next((line.removeprefix("# commit ") for line in lines[:3] if line.startswith("# commit ")), "?")
    build = ", ".join(f"{name} {version}" if log.parent == WITH_LOGS else version for name, version in versions)
    return {"version": log.stem, "build": build or "?", "commit": commit,
            "command": lines[0].removeprefix("$ ") if lines else "?",
            "summary": summary.group(1) if summary else "no pytest summary (see the log)",
            "seconds": float(summary.group(2)) if summary else None, "failed": failed}


def write_table(rows: list[dict], packages: bool = False) -> Path:
    out = OUT / ("package_versions.md" if packages else "torch_versions.md")
    if packages:
        text = ["# The test suite under other versions of other packages", "",
                "Made by `python scripts/check_torch_versions.py --with ...` (2 CPU cores, 2 pytest workers; the "
                "named packages installed over `.venv`'s others by `scripts/test_with.sh`). CI runs what a plain "
                "install resolves to (`results/install/resolved.md`). The logs are in `results/install/with/`. What "
                "the failures were and what was fixed: `docs/install.md`, \"Both ends of the range, tested\".", "",
                "| packages | commit | command | result | seconds | failed |", "|---|---|---|---|---|---|"]
    else:
        text = ["# The test suite under other torch versions", "",
                "Made by `python scripts/check_torch_versions.py` (2 CPU cores, 2 pytest workers; each torch is PyPI's "
                "Linux wheel, a CUDA build that runs on a CPU, installed over `.venv`'s other packages by "
                "`scripts/test_with_torch.sh`). CI runs torch 2.13.0, the CPU build (`results/test_suite/README.md`). "
                "The logs are in `results/install/torch/`. What the failures are, and what was fixed after a run: "
                "`docs/distributed.md`, \"torch 2.6 to 2.15\".", "",
                "| torch | commit | command | result | seconds | failed |", "|---|---|---|---|---|---|"]
    for row in rows:
        seconds = f"{row['seconds']:.0f}" if row["seconds"] is not None else "-"
        failed = "<br>".join(f"`{name}`" for name in row["failed"]) or "none"
        text.append(f"| {row['build']} | {row['commit']} | `{row['command']}` | {row['summary']} | {seconds} | "
                    f"{failed} |")
    out.write_text("\n".join(text) + "\n")
    return out


def version_key(log: Path) -> tuple:
    """By version; a version's run before its fixes (``..._before_the_fixes.log``) before the run after them."""
    return tuple(int(part) for part in re.findall(r"\d+", log.stem)), "before_the_fixes" not in log.stem


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", nargs="+", default=None, help="torch versions (default: 2.6.0 2.15.0)")
    parser.add_argument("--with", dest="with_", nargs="+", default=[], metavar="REQUIREMENTS",
                        help="comma-separated pip requirements to test with instead of a torch version, e.g. "
                             "transformers==5.17.0,huggingface-hub==1.33.0")
    parser.add_argument("--tests", nargs="+", default=["trainers_tests"])
    parser.add_argument("--from-logs", action="store_true", help="only rebuild the tables from the kept logs")
    args = parser.parse_args(argv)
    if not args.from_logs:
        for version in args.versions if args.versions is not None else ([] if args.with_ else ["2.6.0", "2.15.0"]):
            run_version(version, args.tests)
        for requirements in args.with_:
            run_with(requirements, args.tests)
    rows = []
    for logs, packages in ((LOGS, False), (WITH_LOGS, True)):
        table = [summarize(log) for log in sorted(logs.glob("*.log"), key=version_key)]
        if table:
            print(f"wrote {write_table(table, packages)}")
        rows += table
    for row in rows:
        print(f"{row['build']}: {row['summary']}")
    return 1 if any(row["failed"] or row["seconds"] is None for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
