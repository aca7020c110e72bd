"""The README's numbers, generated from the files under results/ (one source of truth for the front page).

    python benchmarks/front_page.py            # rewrite the README's generated blocks and results/front_page/
    python benchmarks/front_page.py --check    # exit 1 if the README's blocks differ from what the files give

The README has three generated blocks, each between ``<!-- front_page.py: NAME -->`` and ``<!-- /front_page.py -->``:

* ``quickstart``: the end of ``trl-variants train erpo``'s real output (``results/quickstart/train_erpo.log``, made
  by ``bash benchmarks/quickstart.sh``) and its wall time (``results/quickstart/run.json``);
* ``results``: one row per trainer: its step-time ratios against the targets of ``benchmarks/targets.py`` (paired
  ratios recomputed from the raw runs of the benchmark file named in :data:`SOURCES`), its peak-memory ratio, and
  the verdict and numbers of its paper's claim in the replication and in the paper's regime (the ``claims`` of each
  study's ``replication.json``);
* ``suite``: how long the README's test command took on a clean clone (``results/test_suite/run.json``, made by
  ``bash benchmarks/time_suite.sh``).

It also writes ``results/front_page/front_page.json`` (every number of the table with the file it comes from).
``trainers_tests/test_front_page.py`` fails when the README's blocks differ from the files, or when a number in the
README's prose is in none of the files that its paragraph links.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from targets import TARGETS  # noqa: E402

BLOCK = re.compile(r"(<!-- front_page\.py: (\w+) -->\n)(.*?)(<!-- /front_page\.py -->)", re.S)

# (variant, baseline) of a target -> the benchmark run it is read from (the latest run that holds both, paired)
SOURCES = {
    ("erpo", "grpo_beta0"): "results/benchmarks/benchmarks_parts.json",
    ("dph", "grpo_beta0_accuracy"): "results/benchmarks/benchmarks_parts.json",
    ("eepo", "grpo_two_generates"): "results/benchmarks/benchmarks_eepo_pair.json",
    ("eepo", "grpo_beta0"): "results/benchmarks/benchmarks_eepo_pair.json",
    ("apo", "grpo_g2_half"): "results/benchmarks/benchmarks_apo_floor.json",
    ("apo", "a2po"): "results/benchmarks/benchmarks_apo_floor.json",
    ("apo", "grpo_g2"): "results/benchmarks/benchmarks_apo_floor.json",
}
BASELINE_LABEL = {"grpo_beta0": "GRPO", "grpo_g2": "GRPO(G=2)", "grpo_beta0_accuracy": "GRPO (same reward)",
                  "grpo_two_generates": "GRPO in two half calls", "grpo_g2_half": "GRPO(G=2), same rows",
                  "a2po": "A2POTrainer"}
# trainer row: (label, variant, paper name in the claims, regime studies). A study whose results are not there yet
# is left out: the confirmatory rounds (results/claims_protocol.md, seeds 5-14) appear once they have run, first.
ROWS = (
    ("ERPO", "erpo", "ERPO", ()),
    ("EEPO", "eepo", "EEPO", ("replication_hard_split_confirm", "replication_hard_split", "replication_narrow_eepo")),
    ("DPH-RL", "dph", "DPH-RL", ("replication_narrow_confirm", "replication_narrow")),
    ("A*-PO", "apo", "A*-PO", ("replication_apo_regime_confirm", "replication_apo_regime")),
)
MEASURES_SHOWN = 2  # numbers per claim cell: the claim's first measures; the page has them all


def _bench():
    spec = importlib.util.spec_from_file_location("bench_trainers", ROOT / "benchmarks/bench_trainers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _link(path: str, text: str) -> str:
    return f"[{text}]({path})"


def step_cells(variant: str, bench) -> tuple[list[str], list[dict]]:
    """The step-time cells of one trainer: each target's paired ratio, bound and verdict, linked to its file."""
    cells, records = [], []
    for v, base, bound, regime, says in TARGETS:
        if v != variant:
            continue
        source = SOURCES[(v, base)]
        data = json.loads((ROOT / source).read_text())
        row = next(r for r in bench.regime_targets(data["runs"], data["settings"]) if r["baseline"] == base)
        verdict = {True: "met", False: "not met", None: "not judged on CPU"}[row["met"]]
        label = BASELINE_LABEL[base] + (" per prompt" if base == "grpo_g2" else "")
        cells.append(f"{row['ratio']:.2f}x {label} (target <= {bound:.2f}x, {regime}: {verdict}; "
                     f"{_link(source.replace('.json', '.md'), 'run')})")
        records.append({"variant": v, "baseline": base, "ratio": round(row["ratio"], 3), "bound": bound,
                        "regime": regime, "says": says, "met": row["met"], "file": source})
    return cells, records


def memory_cell(variant: str, bench) -> tuple[str, dict]:
    """Peak memory against the variant's own baseline in ``bench_trainers.VARIANTS``, from the run of its first target."""
    v, first = next((v, b) for v, b, *_ in TARGETS if v == variant)
    source, base = SOURCES[(v, first)], bench.VARIANTS[v][0]
    summary = json.loads((ROOT / source).read_text())["summary"]
    ratio = summary[v]["peak_mem_mb"] / summary[base]["peak_mem_mb"]
    return (f"{ratio:.2f}x {BASELINE_LABEL[base]} ({_link(source.replace('.json', '.md'), 'run')})",
            {"variant": v, "baseline": base, "peak_mem_ratio": round(ratio, 3), "file": source})


def _pm(pair, digits: int) -> str:
    mean, half = pair
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


def claim_cell(study: str, paper: str) -> tuple[str, dict] | tuple[None, None]:
    source = f"results/{study}/replication.json"
    if not (ROOT / source).is_file():  # a study not run yet
        return None, None
    data = json.loads((ROOT / source).read_text())
    claims = [c for c in data.get("claims", []) if c["paper"] == paper]
    if not claims:
        return None, None
    c = claims[0]
    shown = []
    for name, (ours, theirs) in list(c["numbers"].items())[:MEASURES_SHOWN]:
        digits = 0 if "wall time" in name else c.get("digits", {}).get(name, 3)
        labels = c.get("labels", {}).get(name, [paper, "GRPO"])
        difference = c.get("differences", {}).get(name)  # an "equal or better" part reads this, not the two means
        shown.append(f"{name} {_pm(ours, digits)} vs {_pm(theirs, digits)}"
                     + ("" if labels[1].startswith("GRPO") else f" ({labels[1]})")
                     + (f", paired difference {_pm(difference, digits)}" if difference else ""))
    parts = "; ".join(f"{part}: {verdict}" for part, verdict in c["parts"].items())
    seeds = data.get("settings", {}).get("seeds", [])
    rounds = f"confirmatory, seeds {seeds[0]}-{seeds[-1]}: " if study.endswith("_confirm") and seeds else ""
    cell = (f"{rounds}**{c['verdict']}** ({parts})<br>{'; '.join(shown)} "
            f"({_link(f'results/{study}/README.md', 'page')})")
    return cell, {"study": study, "paper": paper, "verdict": c["verdict"], "parts": c["parts"],
                  "numbers": {k: v for k, v in list(c["numbers"].items())[:MEASURES_SHOWN]}, "file": source}


def results_block(bench) -> tuple[str, list[dict]]:
    lines = ["| trainer | step time, paired ratio (target) | peak memory | the paper's claim, toy setting (5 seeds, "
             "mean ± 95% CI, vs TRL's GRPOTrainer) | in the paper's regime |", "|---|---|---|---|---|"]
    records = []
    for label, variant, paper, studies in ROWS:
        steps, step_records = step_cells(variant, bench)
        mem, mem_record = memory_cell(variant, bench)
        toy, toy_record = claim_cell("replication", paper)
        regime_cells, regime_records = [], []
        for study in studies:
            cell, record = claim_cell(study, paper)
            if cell:
                regime_cells.append(cell)
                regime_records.append(record)
        lines.append(f"| {label} | {'<br>'.join(steps)} | {mem} | {toy} | {'<br>'.join(regime_cells) or '-'} |")
        records.append({"trainer": label, "step_time": step_records, "memory": mem_record, "claim": toy_record,
                        "regime": regime_records})
    return "\n".join(lines) + "\n", records


def quickstart_block() -> str:
    log = (ROOT / "results/quickstart/train_erpo.log").read_text().splitlines()
    start = next(i for i, line in enumerate(log) if line.startswith("held-out accuracy"))
    end = next(i for i, line in enumerate(log) if line.startswith("model saved"))
    run = json.loads((ROOT / "results/quickstart/run.json").read_text())
    minutes, seconds = divmod(round(run["wall_seconds"]), 60)
    return ("```\n" + "\n".join(log[start:end + 1]) + "\n```\n\n"
            f"That run took {minutes} min {seconds:02d} s on {run['cpu_cores']} CPU cores, held-out evaluations "
            f"included ({_link('results/quickstart/README.md', 'the run')}: its full log, `heldout.json` and the "
            "plot).\n")


def suite_block() -> str:
    path = ROOT / "results/test_suite/run.json"
    if not path.is_file():
        return "The test suite's time on a clean clone is not recorded yet (`bash benchmarks/time_suite.sh`).\n"
    run = json.loads(path.read_text())
    minutes, seconds = divmod(round(run["wall_seconds"]), 60)
    failed = run.get("failed", 0)
    if failed or run.get("exit_status", 0) != 0:  # a run that failed is said so, never shown as a time
        return (f"**The last clean-clone run failed** (commit {run.get('commit', '?')}: {failed} failed, "
                f"{run['passed']} passed; {_link('results/test_suite/README.md', 'the run')}).\n")
    return (f"On a clean clone it took {minutes} min {seconds:02d} s on {run['cpu_cores']} CPU cores, creating .venv included "
            f"({run['passed']} passed, {run['skipped']} skipped; {_link('results/test_suite/README.md', 'the run')}).\n")


def generate() -> tuple[dict[str, str], list[dict]]:
    table, records = results_block(_bench())
    return {"quickstart": quickstart_block(), "results": table, "suite": suite_block()}, records


def fill(readme: str, blocks: dict[str, str]) -> str:
    missing = set(blocks) - {m.group(2) for m in BLOCK.finditer(readme)}
    if missing:
        raise SystemExit(f"README.md lacks the generated block(s) {sorted(missing)}: add "
                         "'<!-- front_page.py: NAME -->' and '<!-- /front_page.py -->' lines where each belongs")
    return BLOCK.sub(lambda m: m.group(1) + blocks[m.group(2)] + m.group(4), readme)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that README.md is up to date (exit 1 if not)")
    args = parser.parse_args(argv)
    blocks, records = generate()
    readme_path = ROOT / "README.md"
    readme = readme_path.read_text()
    new = fill(readme, blocks)
    if args.check:
        if new != readme:
            print("README.md's generated blocks differ from results/: run python benchmarks/front_page.py")
            return 1
        return 0
    readme_path.write_text(new)
    out = ROOT / "results/front_page"
    out.mkdir(parents=True, exist_ok=True)
    (out / "front_page.json").write_text(json.dumps({"targets": [list(t) for t in TARGETS], "rows": records},
                                                    indent=1) + "\n")
    print(f"README.md and {out.relative_to(ROOT)}/front_page.json written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
