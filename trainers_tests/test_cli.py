"""``trl-variants --help``, ``presample --help`` and ``evaluate --help`` document every flag; ``evaluate`` stops
before loading a model when matplotlib is missing."""

from __future__ import annotations

import dataclasses
import re
import sys

import pytest

from trl_variants import cli
from trl_variants.evaluate import EvalConfig
from trl_variants.presample import PresampleConfig

PARSED = {"presample": (cli.PresampleScriptArguments, PresampleConfig),
          "evaluate": (cli.EvaluateScriptArguments, EvalConfig)}


def _help(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def _flag_help(text: str) -> dict[str, str]:
    """``{--flag: its help text}`` for every option entry of an argparse help page."""
    entries, current = [], None
    for line in text.splitlines():
        if re.match(r"^  -", line):
            current = [line]
            entries.append(current)
        elif current is not None and re.match(r"^ {3,}\S", line):
            current.append(line)
        else:
            current = None
    out = {}
    for first, *rest in entries:
        m = re.match(r"(.*?\S)\s{2,}(\S.*)$", first.strip())  # help on the same line after 2+ spaces, or below
        invocation, same_line = (m.group(1), m.group(2)) if m else (first.strip(), "")
        help_text = " ".join([same_line, *(r.strip() for r in rest)]).strip()
        for flag in re.findall(r"--[\w-]+", invocation):
            out[flag] = help_text
    return out


def test_top_level_help_lists_commands(capsys):
    text = _help(capsys, ["--help"])
    for name in cli.COMMANDS:
        assert f"  {name} " in text and cli.COMMAND_HELP[name] in text
    assert "trl-variants COMMAND --help" in text


@pytest.mark.parametrize("command", list(PARSED))
def test_every_flag_has_help(capsys, command):
    text = _help(capsys, [command, "--help"])
    flags = _flag_help(text)
    for cls in PARSED[command]:
        for f in dataclasses.fields(cls):
            assert f"--{f.name}" in flags, f"{command}: --{f.name} missing from --help"
    assert "--config FILE.yaml: read the options above from a YAML file" in " ".join(text.split())
    undocumented = [flag for flag, h in flags.items() if not re.sub(r"\(default: .*\)$", "", h).strip()]
    assert not undocumented, f"{command}: flags without help text: {undocumented}"


def test_evaluate_checks_matplotlib_before_loading_a_model(monkeypatch, tmp_path):
    import transformers

    import trl_variants.evaluate as ev

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    fail = lambda *a, **k: pytest.fail("a model or dataset was loaded before the matplotlib check")  # noqa: E731
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail)
    monkeypatch.setattr(ev, "evaluate", fail)
    monkeypatch.setattr(cli, "load_eval_dataset", fail)
    with pytest.raises(ImportError, match=r"pip install matplotlib .*trl-variants\[plots\]"):
        cli.main(["evaluate", "--output_dir", str(tmp_path)])
