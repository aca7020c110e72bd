"""A ``--config`` that names no recipe, a YAML path that does not exist or a YAML file that does not parse is a user
error like any other: ``trl-variants: error: <message>`` on one line, exit code 2, before anything loads
(``trainers_tests/test_cli_errors.py`` has the convention). It used to exit with code 1 (a missing recipe) or print
a ``yaml.parser.ParserError`` traceback (a YAML syntax error)."""

from __future__ import annotations

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
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2, (exit_info.value.code, err)
    assert len(err) == 1 and err[0].startswith("trl-variants: error: "), err  # one line, no traceback
    return err[0]


@pytest.mark.parametrize("value", ["no_such_recipe", "erpo/no_such_recipe", "{tmp}/missing.yaml"],
                         ids=["bare-name", "method/name", "missing-path"])
def test_a_config_that_names_nothing_is_a_one_line_error(capsys, monkeypatch, no_model_load, tmp_path, value):
    value = value.format(tmp=tmp_path)
    line = _error(capsys, monkeypatch, ["train", "erpo", "--config", value, "--output_dir", str(tmp_path)])
    assert line.startswith(f"trl-variants: error: --config {value}: no such file, and no shipped recipe")
    assert "`trl-variants recipes` lists them" in line  # the fix


def test_a_config_that_does_not_parse_is_a_one_line_error(capsys, monkeypatch, no_model_load, tmp_path):
    recipe = tmp_path / "broken.yaml"
    recipe.write_text("learning_rate: [1e-6\nmax_steps: : 2\n")
    line = _error(capsys, monkeypatch, ["train", "erpo", "--config", str(recipe), "--output_dir", str(tmp_path)])
    assert line.startswith(f"trl-variants: error: --config {recipe}: not valid YAML") and "line 1" in line


def test_a_config_that_is_not_a_mapping_is_already_a_one_line_error(capsys, monkeypatch, no_model_load, tmp_path):
    recipe = tmp_path / "list.yaml"
    recipe.write_text("- learning_rate\n- 1e-6\n")
    line = _error(capsys, monkeypatch, ["train", "erpo", "--config", str(recipe), "--output_dir", str(tmp_path)])
    assert f"Config file {recipe} must contain a YAML mapping" in line
