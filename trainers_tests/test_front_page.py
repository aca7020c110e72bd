"""The README is short and true: its generated blocks equal what the results files give, every number in its prose
is in a file that its paragraph links, and its code examples train with the settings of the recipes they mirror."""

import importlib.util
import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

GENERATED = re.compile(r"<!-- front_page\.py: \w+ -->\n.*?<!-- /front_page\.py -->", re.S)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`[^`]*`")
# a number standing alone: not part of a word or name (FSDP2, ZeRO-2/3, pass@16, 1M-parameter, arXiv ids in URLs)
NUMBER = re.compile(r"(?<![\w.@/-])\d+(?:\.\d+)?(?![\w@/%-])")


def _front_page():
    spec = importlib.util.spec_from_file_location("front_page", ROOT / "benchmarks/front_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prose_blocks(text: str) -> list[str]:
    """The README's prose, outside code blocks and generated blocks: one block per paragraph or table row."""
    text = FENCE.sub("\n", GENERATED.sub("\n", text))
    blocks, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            blocks += ["\n".join(current)] if current else []
            blocks.append(line)
            current = []
        elif line.strip():
            current.append(line)
        else:
            blocks += ["\n".join(current)] if current else []
            current = []
    return blocks + (["\n".join(current)] if current else [])


def unsourced_numbers(block: str, root: Path = ROOT) -> list[str]:
    """Numbers of ``block`` found in none of the repository files it links (an external link's own text is its
    source: ``[arXiv 2509.07430](https://...)``)."""
    sources, text = [], INLINE_CODE.sub("", block)
    for label, target in LINK.findall(text):
        if re.match(r"^[a-z][\w+.-]*:", target):
            text = text.replace(f"[{label}]({target})", "")
            continue
        path = root / target.split("#")[0]
        if path.is_file():
            sources.append(path.read_text(encoding="utf-8", errors="replace"))
    text = LINK.sub(lambda m: m.group(1), text)
    return [n for n in NUMBER.findall(text) if not any(n in source for source in sources)]


def test_generated_blocks_match_the_results_files():
    assert _front_page().main(["--check"]) == 0, "run python benchmarks/front_page.py and commit README.md"


def test_generated_blocks_fail_on_a_changed_number(tmp_path, monkeypatch):
    front_page = _front_page()
    blocks, _ = front_page.generate()
    readme = README.read_text()
    assert front_page.fill(readme, blocks) == readme
    # ERPO's paired ratio (results/benchmarks/benchmarks_parts.json)
    ratio = re.search(r"\| ERPO \| (\d\.\d\dx GRPO)", blocks["results"]).group(1)
    damaged = readme.replace(ratio, "9.99x GRPO", 1)
    assert damaged != readme and front_page.fill(damaged, blocks) == readme


def test_a_failed_suite_run_is_said_to_have_failed(tmp_path, monkeypatch):
    front_page = _front_page()
    (tmp_path / "results/test_suite").mkdir(parents=True)
    run = {"commit": "abc1234", "exit_status": 1, "wall_seconds": 1013.1, "cpu_cores": 2, "passed": 1090, "failed": 2,
           "skipped": 3}
    (tmp_path / "results/test_suite/run.json").write_text(json.dumps(run))
    monkeypatch.setattr(front_page, "ROOT", tmp_path)
    said = front_page.suite_block()
    assert said.startswith("**The last clean-clone run failed** (commit abc1234: 2 failed, 1090 passed")
    (tmp_path / "results/test_suite/run.json").write_text(json.dumps({**run, "exit_status": 0, "failed": 0}))
    assert front_page.suite_block().startswith("On a clean clone it took 16 min 53 s on 2 CPU cores")


def test_every_number_in_the_readme_prose_is_in_a_file_it_links():
    problems = {block[:80]: bad for block in prose_blocks(README.read_text()) if (bad := unsourced_numbers(block))}
    assert not problems, f"README numbers in no linked file (link the file that holds each, or drop it): {problems}"


def test_the_number_check_can_fail(tmp_path):
    (tmp_path / "r.md").write_text("greedy 0.956\n")
    assert unsourced_numbers("greedy 0.956 ([run](r.md))", tmp_path) == []
    assert unsourced_numbers("greedy 0.957 ([run](r.md)), 12 steps", tmp_path) == ["0.957", "12"]
    assert unsourced_numbers("ZeRO-2/3, FSDP2, pass@16, `--max_steps 20`, [arXiv 2509.07430](https://x)", tmp_path) == []
    assert prose_blocks("a 1\nb\n\n| r 2 |\n```\n3\n```\n<!-- front_page.py: x -->\n4\n<!-- /front_page.py -->") == \
        ["a 1\nb", "| r 2 |"]


def _snippet_config(text: str, marker: str):
    """The config an example builds: its code block run up to the trainer's construction."""
    block = next(b for b in FENCE.findall(text) if marker in b)
    code = block.split("\n", 1)[1].rsplit("```", 1)[0]
    namespace: dict = {}
    exec(code.split("trainer =")[0], namespace)  # noqa: S102 - the docs' own example
    return namespace["args"]


NOT_TRAINING = {"output_dir", "logging_steps", "save_strategy", "save_steps", "save_total_limit", "report_to",
                "torch_threads", "gradient_checkpointing"}


def _recipe_differences(args, recipe: Path) -> dict:
    values = yaml.safe_load(recipe.read_text())
    return {k: (getattr(args, k), v) for k, v in values.items()
            if hasattr(args, k) and k not in NOT_TRAINING and getattr(args, k) != v}


def test_code_examples_train_as_the_recipes_they_mirror():
    readme_args = _snippet_config(README.read_text(), "ERPOConfig(")
    assert _recipe_differences(readme_args, ROOT / "configs/erpo/tiny_cpu.yaml") == {}
    composed_args = _snippet_config((ROOT / "docs/trainers.md").read_text(), "ComposedConfig(")
    assert _recipe_differences(composed_args, ROOT / "configs/composed/tiny_cpu.yaml") == {}


def test_a_confirmatory_round_is_shown_first_once_it_has_run(tmp_path, monkeypatch):
    """A regime study not run yet is left out; a confirmatory one (``*_confirm``) that has run comes first, labelled
    with its seeds, the exploratory one after it."""
    front_page = _front_page()
    claim = {"paper": "DPH-RL", "verdict": "holds", "parts": {"pass@64 at or above GRPO": "holds"},
             "numbers": {"pass@64": [[0.97, 0.01], [0.95, 0.02]]}}
    for study, seeds in (("replication_narrow", [0, 1, 2, 3, 4]), ("replication_narrow_confirm", list(range(5, 15)))):
        (tmp_path / "results" / study).mkdir(parents=True)
        (tmp_path / "results" / study / "replication.json").write_text(
            json.dumps({"settings": {"seeds": seeds}, "claims": [claim]}))
    monkeypatch.setattr(front_page, "ROOT", tmp_path)
    assert front_page.claim_cell("replication_apo_regime_confirm", "A*-PO") == (None, None)  # not run
    confirm, _ = front_page.claim_cell("replication_narrow_confirm", "DPH-RL")
    exploratory, _ = front_page.claim_cell("replication_narrow", "DPH-RL")
    assert confirm.startswith("confirmatory, seeds 5-14: **holds**") and exploratory.startswith("**holds**")
    assert "pass@64 0.970 ± 0.010 vs 0.950 ± 0.020 ([page]" in confirm  # no difference stored: none shown
    dph_row = next(r for r in front_page.ROWS if r[0] == "DPH-RL")
    assert dph_row[3] == ("replication_narrow_confirm", "replication_narrow")


def test_an_equal_or_better_part_shows_the_paired_difference_it_is_read_on(tmp_path, monkeypatch):
    """The README cell of a non-inferiority part shows the paired difference, so its verdict can be checked there."""
    front_page = _front_page()
    claim = {"paper": "EEPO", "verdict": "inconclusive", "parts": {"greedy accuracy equal or better": "inconclusive"},
             "numbers": {"greedy": [[0.903, 0.038], [0.903, 0.073]]}, "differences": {"greedy": [0.0, 0.061]}}
    (tmp_path / "results" / "replication").mkdir(parents=True)
    (tmp_path / "results" / "replication" / "replication.json").write_text(
        json.dumps({"settings": {"seeds": [0, 1, 2, 3, 4]}, "claims": [claim]}))
    monkeypatch.setattr(front_page, "ROOT", tmp_path)
    cell, _ = front_page.claim_cell("replication", "EEPO")
    assert "greedy 0.903 ± 0.038 vs 0.903 ± 0.073, paired difference 0.000 ± 0.061 (" in cell
