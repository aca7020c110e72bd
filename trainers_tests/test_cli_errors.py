"""What a newcomer sees when a command line is wrong: one line, ``trl-variants: error: <message with the fix>``, exit
code 2, before anything loads (``--traceback`` shows the traceback); a method's ``--help`` starts with what the
method is and its own options; ``trl-variants --help`` answers without importing torch."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from transformers import PreTrainedModel

from trl_variants import cli


@pytest.fixture
def no_model_load(monkeypatch):
    monkeypatch.setattr(PreTrainedModel, "from_pretrained",
                        classmethod(lambda cls, *a, **k: pytest.fail("a model was loaded before the error")))


def _error(capsys, monkeypatch, argv) -> str:
    monkeypatch.setattr(sys, "argv", ["trl-variants", *argv])  # as the command (main(argv) from Python raises)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trl-variants: error: "), err  # one line, no traceback
    return err[0]


@pytest.mark.parametrize(("flags", "expected"), [
    (["--lerning_rate", "1e-3"], "unknown option --lerning_rate (--lerning_rate: did you mean --learning_rate?)"),
    (["--learning_rate", "abc"], "argument --learning_rate/--learning-rate: invalid float value: 'abc'"),
    (["--temperature", "0"], "temperature must be a finite number > 0, got 0.0"),
], ids=["mistyped-flag", "wrong-type", "failed-check"])
def test_a_user_error_is_one_line_with_the_fix(capsys, monkeypatch, no_model_load, tmp_path, flags, expected):
    line = _error(capsys, monkeypatch, ["train", "erpo", *flags, "--output_dir", str(tmp_path)])
    assert expected in line


def test_traceback_flag_raises_the_error(monkeypatch, no_model_load, tmp_path):
    monkeypatch.setattr(sys, "argv", ["trl-variants", "train", "erpo", "--lerning_rate", "1e-3", "--traceback"])
    with pytest.raises(ValueError, match="did you mean --learning_rate"):
        cli.main()


def test_method_help_starts_with_what_it_is_and_its_own_options(capsys):
    from trl import GRPOConfig

    from trl_variants import ERPOConfig

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "erpo", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    own = [f.name for f in dataclasses.fields(ERPOConfig) if f.name not in {g.name for g in
                                                                            dataclasses.fields(GRPOConfig)}]
    lines = text.splitlines()
    assert lines[0].startswith("usage: trl-variants train erpo") and len(lines[0]) < 100
    assert "Configuration for ERPOTrainer" in " ".join(lines[:6])
    first_option = next(i for i, line in enumerate(lines) if line.startswith("  --"))
    assert lines[first_option - 1].startswith("ERPOConfig options")
    assert lines[first_option].split()[0].removeprefix("--").rstrip(",") in own
    where = {name: text.index(f"  --{name} ") for name in [*own, "learning_rate", "dataset_name"]}
    assert max(where[n] for n in own) < min(where["learning_rate"], where["dataset_name"])
    assert "(recipe erpo/tiny_cpu: 0.01)" in " ".join(text.split())  # query_kl_coef, set by the tiny recipe


def test_top_level_help_does_not_import_torch():
    code = ("import sys\nfrom trl_variants.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "  train " in proc.stdout


# --config naming no recipe or file, or a file that is not valid YAML (it used to exit with code 1, or print a
# yaml.parser.ParserError traceback)
@pytest.mark.parametrize("value", ["no_such_recipe", "erpo/no_such_recipe", "{tmp}/missing.yaml"],
                         ids=["bare-name", "method/name", "missing-path"])
def test_a_config_that_names_nothing_is_a_one_line_error(capsys, monkeypatch, no_model_load, tmp_path, value):
    value = value.format(tmp=tmp_path)
    line = _error(capsys, monkeypatch, ["train", "erpo", "--config", value, "--output_dir", str(tmp_path)])
    assert line.startswith(f"trl-variants: error: --config {value}: no such file, and no shipped recipe")
    assert "`trl-variants recipes` lists them" in line  # the fix


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_a_config_followed_by_a_flag_says_its_value_is_missing(capsys, monkeypatch, no_model_load, tmp_path, command):
    argv = [command, *(["erpo"] if command == "train" else []), "--config", "--output_dir", str(tmp_path)]
    line = _error(capsys, monkeypatch, argv)
    assert line.startswith("trl-variants: error: --config needs a value (a shipped recipe's name or a YAML file), "
                           "got the flag --output_dir: write `--config <recipe or file> --output_dir ...`")


def test_a_config_that_does_not_parse_is_a_one_line_error(capsys, monkeypatch, no_model_load, tmp_path):
    recipe = tmp_path / "broken.yaml"
    recipe.write_text("learning_rate: [1e-6\nmax_steps: : 2\n")
    line = _error(capsys, monkeypatch, ["train", "erpo", "--config", str(recipe), "--output_dir", str(tmp_path)])
    assert line.startswith(f"trl-variants: error: --config {recipe}: not valid YAML") and "line 1" in line


def test_a_config_that_is_not_a_mapping_is_a_one_line_error(capsys, monkeypatch, no_model_load, tmp_path):
    recipe = tmp_path / "list.yaml"
    recipe.write_text("- learning_rate\n- 1e-6\n")
    line = _error(capsys, monkeypatch, ["train", "erpo", "--config", str(recipe), "--output_dir", str(tmp_path)])
    assert f"Config file {recipe} must contain a YAML mapping" in line
