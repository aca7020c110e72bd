"""Wall time of ``trl-variants --help`` and ``trl-variants train erpo --help``: the median of 5 runs of each in a
fresh process (the installed ``trl-variants`` script next to this Python, else ``python -m trl_variants``), printed
as a table with the number of lines each prints and whether torch was imported.

    python benchmarks/bench_cli_help.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = (["--help"], ["train", "--list"], ["train", "erpo", "--help"])
# the same command through `python -c`, to ask the process whether it imported torch
PROBE = ("import sys\nfrom trl_variants.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
         "print('torch' in sys.modules, file=sys.stderr)")


def entry_point() -> list[str]:
    script = Path(sys.executable).parent / "trl-variants"
    return [str(script)] if script.exists() else [sys.executable, "-m", "trl_variants"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    print(f"{'command':<34} {'median s':>9} {'min s':>7} {'lines':>6}  torch imported")
    for argv in COMMANDS:
        times, lines = [], 0
        for _ in range(runs):
            start = time.perf_counter()
            proc = subprocess.run([*entry_point(), *argv], capture_output=True, text=True, env=env)
            times.append(time.perf_counter() - start)
            lines = len(proc.stdout.splitlines())
        probe = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env)
        torch = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "?"
        print(f"{'trl-variants ' + ' '.join(argv):<34} {statistics.median(times):>9.2f} {min(times):>7.2f} "
              f"{lines:>6}  {torch}")


if __name__ == "__main__":
    main()
