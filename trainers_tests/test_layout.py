"""Repository layout: ``docs/`` holds prose only; every generated output lives under ``results/<study>/`` beside a
README.md that names the command (an existing script) that made it."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED_SUFFIXES = {".json", ".png", ".jpg", ".svg", ".csv", ".log"}
# `python benchmarks/x.py`, `bash benchmarks/run_all.sh`, `.venv/bin/python scripts/y.py`, ...
COMMAND = re.compile(r"(?:python|bash)\s+((?:benchmarks|scripts|examples)/[\w./+-]+\.(?:py|sh))")
# an output path under docs/ in a script: ROOT / "docs" / ..., --out docs/..., > docs/...
WRITES_DOCS = re.compile(r'ROOT\s*/\s*"docs"\s*/|--out[ =]+docs/|>\s*docs/')


def generated_files(docs: Path) -> list[str]:
    """Files under ``docs`` that look generated: data/plot/log suffixes, or a .md whose first line is a
    ``Settings:`` line or a table row (what the benchmark scripts write)."""
    found = []
    for path in sorted(p for p in docs.rglob("*") if p.is_file()):
        if path.suffix in GENERATED_SUFFIXES:
            found.append(path.relative_to(docs).as_posix())
        elif path.suffix == ".md":
            first = path.read_text(encoding="utf-8").lstrip().split("\n", 1)[0]
            if first.startswith(("Settings:", "|")):
                found.append(path.relative_to(docs).as_posix())
    return found


def results_without_command(results: Path, repo: Path = ROOT) -> list[str]:
    """``results/*/`` folders whose README.md is missing or names no command running a script that exists."""
    bad = []
    for folder in sorted(p for p in results.iterdir() if p.is_dir()):
        readme = folder / "README.md"
        scripts = COMMAND.findall(readme.read_text(encoding="utf-8")) if readme.is_file() else []
        if not any((repo / s).is_file() for s in scripts):
            bad.append(f"{folder.name}/ ({'README.md names no existing script' if readme.is_file() else 'no README.md'})")
    return bad


def test_docs_hold_prose_only():
    found = generated_files(ROOT / "docs")
    assert not found, (f"generated files under docs/: {found}; move them (git mv) to results/<study>/ and name the "
                       "command that made them in results/<study>/README.md")


def test_every_results_folder_names_its_command():
    assert (ROOT / "results").is_dir()
    bad = results_without_command(ROOT / "results")
    assert not bad, f"results folders without a README naming the command that made them: {bad}"


def test_scripts_do_not_write_into_docs():
    """The producing scripts' default outputs point under results/, never docs/."""
    files = [*ROOT.glob("benchmarks/*.py"), *ROOT.glob("benchmarks/*.sh"), *ROOT.glob("scripts/*.py"),
             *ROOT.glob("scripts/*.sh")]
    assert len(files) >= 8
    offenders = [f.relative_to(ROOT).as_posix() for f in files if WRITES_DOCS.search(f.read_text(encoding="utf-8"))]
    assert not offenders, f"these scripts write into docs/ (write under results/<study>/ instead): {offenders}"


def test_checks_detect_what_they_should(tmp_path):
    """The checks above flag exactly the planted cases (so they can fail)."""
    assert WRITES_DOCS.search('(ROOT / "docs" / "eepo_eps_study.md").write_text(text)')
    assert WRITES_DOCS.search("    --reps 3 --steps 8 --out docs/benchmarks")
    assert WRITES_DOCS.search("python scripts/build_tiny_default.py > docs/build.log")
    assert not WRITES_DOCS.search('default=str(ROOT / "results" / "benchmarks" / "benchmarks")')
    assert not WRITES_DOCS.search('echo "done (prose: docs/RESULTS.md)"')

    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "prose.md").write_text("# Title\n\n| a | b |\n|---|---|\n")  # a page that contains a table: prose
    (docs / "bench.md").write_text("Settings: {'reps': 3}\n\n| a |\n")
    (docs / "sub" / "table.md").write_text("| model | greedy |\n|---|---|\n")
    (docs / "sub" / "numbers.json").write_text("{}")
    (docs / "curve.png").write_bytes(b"\x89PNG")
    (docs / "build.log").write_text("step 1\n")
    assert generated_files(docs) == ["bench.md", "build.log", "curve.png", "sub/numbers.json", "sub/table.md"]

    results = tmp_path / "results"
    for name, readme in [("good", "Made by\n\n    python benchmarks/bench_presample.py\n"),
                         ("good_bash", "Run `bash benchmarks/run_all.sh`.\n"),
                         ("missing_script", "Made by `python benchmarks/no_such_script.py`.\n"),
                         ("prose_only", "Numbers from a benchmark.\n"),
                         ("no_readme", None)]:
        (results / name).mkdir(parents=True)
        if readme is not None:
            (results / name / "README.md").write_text(readme)
    assert results_without_command(results) == ["missing_script/ (README.md names no existing script)",
                                                "no_readme/ (no README.md)",
                                                "prose_only/ (README.md names no existing script)"]
