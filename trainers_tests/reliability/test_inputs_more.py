"""Inputs that used to pass silently or fail late: a YAML list option given one value without brackets, a presample
cache directory that is a file, a damaged evaluation results file, a resume with other settings passed to train()."""

from __future__ import annotations

import json

import pytest
from transformers import PreTrainedModel

from trainers_tests.helpers import small_config, train_dataset
from trl_variants import cli
from trl_variants.cli.evaluate_command import parse_evaluate_args
from trl_variants.training import check_prerequisites, model_path, parse_args


@pytest.fixture
def no_model_load(monkeypatch):
    monkeypatch.setattr(PreTrainedModel, "from_pretrained",
                        classmethod(lambda cls, *a, **k: pytest.fail("a model was loaded before the check")))


def test_a_yaml_list_option_with_one_value_is_a_one_item_list(tmp_path):
    from trl_variants import ComposedConfig

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"parts: erpo_query_kl\nreward_funcs: accuracy_reward\noutput_dir: {tmp_path}\nuse_cpu: true\n")
    script_args, training_args, _ = parse_args(ComposedConfig, argv=["--config", str(recipe)])
    assert training_args.parts == ["erpo_query_kl"] and script_args.reward_funcs == ["accuracy_reward"]
    (tmp_path / "e.yaml").write_text("temperatures: 1.0\nreward_funcs: accuracy_reward\n")
    script_args, config = parse_evaluate_args(["--config", str(tmp_path / "e.yaml")])
    assert config.temperatures == [1.0] and script_args.reward_funcs == ["accuracy_reward"]


def test_a_presample_cache_dir_that_is_a_file_is_refused_before_the_model_load(tmp_path, no_model_load):
    from trl_variants import DPHConfig

    cache = tmp_path / "cache"
    cache.write_text("not a directory")
    with pytest.raises(ValueError, match=f"presample_cache_dir: {cache} is a file, not a directory"):
        cli.main(["train", "apo", "--presample_cache_dir", str(cache), "--output_dir", str(tmp_path / "out")])

    with pytest.raises(ValueError, match="pass --presample_cache_dir DIR"):
        check_prerequisites(small_config(DPHConfig, tmp_path, presample_cache_dir=str(cache)))


def test_a_damaged_results_line_is_named_with_the_fix_before_the_model_load(tmp_path, capsys, monkeypatch,
                                                                           no_model_load):
    chunks = tmp_path / "chunks"
    chunks.mkdir()
    good = json.dumps({"kind": "chunk", "pass": "greedy", "chunk": 0})
    (chunks / "tiny.jsonl").write_text(json.dumps({"kind": "header", "key": {}}) + "\n" + good + "\n"
                                       + '{"kind": "chunk", "pass": "greedy", "chu\n' + good + "\n")
    monkeypatch.setattr("sys.argv", ["trl-variants", "evaluate", "--models", "tiny", "--output_dir", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:  # as the command: one line
        cli.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"{chunks / 'tiny.jsonl'}, line 3, is damaged" in err and "--restart true" in err


def test_a_resume_with_other_settings_given_to_train_is_refused_before_any_forward(tmp_path):
    from trl_variants import EEPOConfig, EEPOTrainer, accuracy_reward

    from .test_resume_checks import written_checkpoint

    kw = dict(per_device_train_batch_size=4, num_generations=2, max_steps=1, max_completion_length=8)
    ckpt = written_checkpoint(tmp_path / "checkpoint-1", "EEPOTrainer",
                              small_config(EEPOConfig, tmp_path, learning_rate=1e-3, **kw))
    trainer = EEPOTrainer(model=model_path("tiny"), reward_funcs=accuracy_reward,
                          args=small_config(EEPOConfig, tmp_path, learning_rate=2e-3, **kw),
                          train_dataset=train_dataset(8))
    trainer.model.forward = lambda *a, **k: pytest.fail("a forward ran before the checkpoint was checked")
    with pytest.raises(ValueError, match=r"learning_rate: checkpoint 0\.001, this run 0\.002"):
        trainer.train(resume_from_checkpoint=ckpt)
