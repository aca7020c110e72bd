"""The docs stand alone: users clone only this repository, so nothing a user reads may point outside it.

Checked in README.md, docs/**/*.md, configs/**/*.yaml, results/**/README.md, examples/*.py, trl_variants/**/*.py,
scripts/*, benchmarks/* and the tests (the docstrings and comments of the .py files are checked with the rest of
their text):

* paths into the project's private notes (``shared/``, ``ALGORITHMS.md``, ``papers/<name>.txt``) and line-number
  citations of those paper texts (``l. 291``): cite the paper (title or short name, arXiv id, section / equation /
  table) or docs/algorithms.md instead;
* ``../`` that leaves the repository or names a missing file; absolute paths of the machine the project was built on
  (``/work/``, ``/home/``, ...); ``/tmp/`` used as a reference (it is fine as a scratch output of a command line);
* relative markdown links whose target does not exist in the repository (http(s) links are not checked);
* internal process wording: ``issue #<n>`` and ``session <n>``.

``LEAD_PENDING`` lists the offending lines of files another change is editing at the same time, as (file, a
substring of the line): those are reported by the test below only once they are gone (then remove the entry).
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (path relative to ROOT, substring of the offending line), to be fixed in those files and then removed from here.
LEAD_PENDING: set[tuple[str, str]] = set()

PATTERNS = [
    (re.compile(r"(?<![\w.-])shared/"), "path into the private shared/ folder"),
    (re.compile(r"ALGORITHMS\.md|ALGORITHMS\.txt"), "ALGORITHMS.md is not in the repository: cite docs/algorithms.md"),
    (re.compile(r"(?<![\w.-])papers/[\w.-]+\.txt"), "paper text file not in the repository: cite the paper"),
    (re.compile(r"(?<![\w.])ll?\. \d+"), "line number of a paper text file: cite section / equation / table"),
    (re.compile(r"\bissues? #\d+", re.IGNORECASE), "internal issue number: say what was done instead"),
    (re.compile(r"\bsessions? \d+", re.IGNORECASE), "internal session number: say when or what instead"),
    (re.compile(r"(?<![\w.~-])/(?:work|home|Users|root|mnt|scratch)/"), "absolute path of a particular machine"),
]
TMP = re.compile(r"(?<![\w.~-])/tmp/")
# /tmp/ as the value of a command-line option (`--out /tmp/x`) or on a shell command line is a scratch location
TMP_OPTION = re.compile(r"--[\w-]+[ =]+/tmp/")
COMMAND_START = re.compile(r"^(?:[$>]\s*)?(?:python3?|bash|sh|sha256sum|accelerate|torchrun|trl-variants|pip|cd|ls|"
                           r"rm|mkdir|cat|tee|\.venv/|/tmp/)\b")
URL = re.compile(r"https?://\S+")
MD_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
DOTDOT = re.compile(r"(?<![\w.])(?:\.\./)+[\w./-]*")


def files_to_check(root: Path = ROOT) -> list[Path]:
    """Every file whose text a user reads: docs, configs, results pages, examples, the package, scripts."""
    found = [root / "README.md"] if (root / "README.md").is_file() else []
    for pattern in ("docs/**/*.md", "configs/**/*.yaml", "results/**/README.md", "examples/*.py",
                    "trl_variants/**/*.py", "scripts/*.py", "scripts/*.sh", "benchmarks/*.py", "benchmarks/*.sh"):
        found += sorted(root.glob(pattern))
    # the tests too, but not this file (its cases are the patterns it looks for)
    found += [p for p in sorted(root.glob("trainers_tests/**/*.py")) if p.name != Path(__file__).name]
    return [p for p in found if p.is_file()]


def _inside(target: Path, root: Path) -> bool:
    try:
        target.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def line_problems(line: str, path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with one line of ``path`` (empty when nothing is)."""
    problems = []
    text = URL.sub("", line)  # external links are allowed, and their paths are not ours
    for pattern, why in PATTERNS:
        if pattern.search(text):
            problems.append(why)
    if TMP.search(text) and not TMP_OPTION.search(text):
        command = text.strip().lstrip("#").strip().strip("`")
        if not COMMAND_START.match(command):
            problems.append("/tmp/ used as a reference (only scratch outputs of command lines may live there)")
    links = []
    if path.suffix == ".md":
        for target in MD_LINK.findall(line):
            if re.match(r"^(?:[a-z][\w+.-]*:|#)", target):  # http:, https:, mailto:, in-page anchors
                continue
            links.append(target)
            file_part = target.split("#", 1)[0]
            resolved = path.parent / file_part
            if not _inside(resolved, root):
                problems.append(f"link leaves the repository: {target}")
            elif not resolved.exists():
                problems.append(f"link to a missing file: {target}")
    for match in DOTDOT.findall(text):
        if any(match in link for link in links):
            continue  # checked above as a link
        resolved = path.parent / match
        if not _inside(resolved, root):
            problems.append(f"'../' path leaves the repository: {match}")
        elif not resolved.exists():
            problems.append(f"'../' path to a missing file: {match}")
    return problems


def offenders(root: Path = ROOT, files: list[Path] | None = None) -> list[tuple[str, int, str, str]]:
    """(file, line number, line, problems) for every offending line."""
    found = []
    for path in files if files is not None else files_to_check(root):
        rel = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            problems = line_problems(line, path, root)
            if problems:
                found.append((rel, number, line.strip(), "; ".join(problems)))
    return found


def pending(rel: str, line: str) -> bool:
    return any(rel == file and part in line for file, part in LEAD_PENDING)


def test_docs_point_only_inside_the_repository():
    assert len(files_to_check()) > 40
    found = offenders()
    bad = [f"{rel}:{number}: {problems}\n    {line[:160]}" for rel, number, line, problems in found
           if not pending(rel, line)]
    assert not bad, ("references a user of this repository cannot follow (cite the paper by title / arXiv id and "
                     "section, or link docs/algorithms.md; say what was done instead of an issue or session "
                     "number):\n" + "\n".join(bad))
    stale = sorted(entry for entry in LEAD_PENDING
                   if not any(rel == entry[0] and entry[1] in line for rel, _, line, _ in found))
    assert not stale, f"LEAD_PENDING entries whose line is fixed (remove them from the set): {stale}"


def test_checks_detect_what_they_should(tmp_path):
    """The check flags exactly the planted cases (so it can fail)."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("x\n")
    (tmp_path / "results" / "study").mkdir(parents=True)
    page = tmp_path / "docs" / "page.md"
    cases = {
        "The math is in `shared/ALGORITHMS.md`.": True,
        "As ALGORITHMS.md \"ERPO\" says.": True,
        "See papers/EEPO.txt Sec. 3.": True,
        "| lr | 1e-6 | 1e-6 | l. 244, App. A.5 |": True,
        "Rule (issue #16): every column is checked.": True,
        "Re-measured in Session 2.": True,
        "none was lent to sessions 1-2": True,
        "out: '/work/main/docs/replication'": True,
        "Read /tmp/notes.md first.": True,
        "[spec](../../shared/ALGORITHMS.md)": True,
        "[gone](missing.md)": True,
        "[gone](../results/none/README.md)": True,
        "cp ../outside.txt .": True,
        "[other](other.md#a-section) and [results](../results/study) and ![png](other.md)": False,
        "[arXiv 2505.20686](https://arxiv.org/abs/2505.20686), [anchor](#notation)": False,
        "A*-PO, arXiv 2505.20686, Sec. 4.4; docs/algorithms.md.": False,
        "    python scripts/build.py --out /tmp/tiny/a \\": False,
        "    sha256sum /tmp/rebuild/model.safetensors": False,
        "cached in ~/.cache/trl_variants, resumable": False,
        "a shared/ folder? no: (shared memory) is fine, and so is the word session.": True,
        "the shared memory of a session is fine": False,
        "https://github.com/org/repo/blob/main/shared/x.md is an external URL": False,
        "ll. 3 / l. 12": True,
        "eq. 11 (Sec. 4.2), Table 2": False,
    }
    for line, bad in cases.items():
        assert bool(line_problems(line, page, tmp_path)) == bad, (line, line_problems(line, page, tmp_path))
    # ../ inside a link of a file at the root resolves from that file
    assert line_problems("[results](results/study)", tmp_path / "README.md", tmp_path) == []
    assert line_problems("[up](../README.md)", tmp_path / "README.md", tmp_path)
    # .py files: the same text checks, no markdown-link parsing
    assert line_problems('    """Loss of eq. 8 (issue #13)."""', tmp_path / "mod.py", tmp_path)
    assert not line_problems('    """Loss of eq. 8 (docs/algorithms.md)."""', tmp_path / "mod.py", tmp_path)
    # offenders reports file:line
    page.write_text("fine\nsee `shared/x`\n")
    assert [(rel, n) for rel, n, _, _ in offenders(tmp_path, [page])] == [("docs/page.md", 2)]
