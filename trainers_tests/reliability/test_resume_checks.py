"""The checks a resume makes on its checkpoint (which trainer wrote it, with which settings: ``_checkpoint.py``) run
when the trainer is constructed with ``args.resume_from_checkpoint``, before the model loads and before any offline
pass (ERPO's reference pass, DPH-RL's and A*-PO's sampling), not only at ``train()`` after that expensive pass."""

from __future__ import annotations

import pytest
from transformers import PreTrainedModel, TrainerState

from trl_variants import ComposedConfig, ComposedTrainer, EEPOConfig, EEPOTrainer, accuracy_reward
from trl_variants._checkpoint import RECORD_FORMAT, TrlVariantsCheckpoint, resume_fields, resume_line

from ..helpers import DEFAULT_MODEL_PATH, TRAINERS, small_config, train_dataset

RULE_TRAINERS = [*TRAINERS.values(), (ComposedTrainer, ComposedConfig)]
RULE_IDS = [*TRAINERS, "composed"]


class ModelLoaded(Exception):
    pass


class OfflinePassRan(Exception):
    pass


@pytest.fixture
def no_model_load(monkeypatch):
    def fail(cls, *args, **kwargs):
        raise ModelLoaded(f"{cls.__name__}.from_pretrained was called before the checkpoint was checked")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(fail))


def _config(config_cls, out, **kw):
    kw = {"per_device_train_batch_size": 4, "num_generations": 2, "max_steps": 1, "max_completion_length": 8, **kw}
    if config_cls.__name__ == "APOConfig":
        kw["num_generations"] = 1
    return small_config(config_cls, out, **kw)


def written_checkpoint(path, trainer_name: str, config):
    """A checkpoint's ``trainer_state.json`` with the record ``TrlVariantsCheckpoint.state()`` writes for a trainer
    named ``trainer_name`` run with ``config`` (the weights are not needed: the checks read only this file)."""
    path.mkdir(parents=True)
    record = {"format": RECORD_FORMAT, "trainer": trainer_name, "config": resume_fields(config), "algorithm_state": {}}
    TrainerState(stateful_callbacks={TrlVariantsCheckpoint.__name__: record}).save_to_json(
        str(path / "trainer_state.json"))
    return str(path)


def _build(trainer_cls, config):
    return trainer_cls(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, args=config,
                       train_dataset=train_dataset(8))


@pytest.mark.parametrize("trainer_cls,config_cls", RULE_TRAINERS, ids=RULE_IDS)
def test_checkpoint_of_another_trainer_refused_at_construction(trainer_cls, config_cls, tmp_path, no_model_load):
    other = "EEPOTrainer" if trainer_cls is not EEPOTrainer else "ERPOTrainer"
    ckpt = written_checkpoint(tmp_path / "checkpoint-1", other, _config(EEPOConfig, tmp_path))
    with pytest.raises(ValueError, match=rf"checkpoint .*checkpoint-1 was written by {other}; resume it with {other}, "
                                         r"or start a new run without resume_from_checkpoint"):
        _build(trainer_cls, _config(config_cls, tmp_path, resume_from_checkpoint=ckpt))


@pytest.mark.parametrize("trainer_cls,config_cls", RULE_TRAINERS, ids=RULE_IDS)
def test_checkpoint_with_another_learning_rate_refused_at_construction(trainer_cls, config_cls, tmp_path,
                                                                      no_model_load):
    ckpt = written_checkpoint(tmp_path / "checkpoint-1", trainer_cls.__name__,
                              _config(config_cls, tmp_path, learning_rate=1e-3))
    with pytest.raises(ValueError, match=r"written with other settings \(learning_rate: checkpoint 0\.001, this run "
                                         r"0\.002\).*set learning_rate back"):
        _build(trainer_cls, _config(config_cls, tmp_path, learning_rate=2e-3, resume_from_checkpoint=ckpt))
    with pytest.raises(ModelLoaded):  # the same settings: construction goes on
        _build(trainer_cls, _config(config_cls, tmp_path, learning_rate=1e-3, resume_from_checkpoint=ckpt))


@pytest.mark.parametrize("trainer_cls,config_cls", RULE_TRAINERS, ids=RULE_IDS)
def test_missing_checkpoint_refused_at_construction(trainer_cls, config_cls, tmp_path, no_model_load):
    missing = str(tmp_path / "checkpoint-7")
    with pytest.raises(ValueError, match=r"cannot resume from .*checkpoint-7: .*checkpoint-7 is not a directory"):
        _build(trainer_cls, _config(config_cls, tmp_path, resume_from_checkpoint=missing))


def test_real_checkpoint_of_another_trainer_refused_before_the_offline_pass(tmp_path, monkeypatch):
    """EEPO saves a checkpoint; DPH-RL constructed to resume it is refused before its offline pass samples."""
    from trl_variants import DPHConfig, DPHTrainer

    eepo = EEPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, train_dataset=train_dataset(8),
                       args=_config(EEPOConfig, tmp_path / "eepo", save_strategy="steps", save_steps=1))
    eepo.train()
    ckpt = tmp_path / "eepo" / "checkpoint-1"
    assert (ckpt / "trainer_state.json").exists()

    def offline_pass(*args, **kwargs):
        raise OfflinePassRan("DPH-RL's offline pass ran before the checkpoint was checked")

    monkeypatch.setattr("trl_variants._offline.presample", offline_pass)
    args = _config(DPHConfig, tmp_path / "dph", num_presamples=2, pef_threshold=2, resume_from_checkpoint=str(ckpt),
                   presample_cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"was written by EEPOTrainer; resume it with EEPOTrainer"):
        _build(DPHTrainer, args)


def test_a_run_may_resume_with_the_lazy_stage_1_switched():
    """lazy_value_pass decides when A*-PO's stage 1 runs, not its values: a checkpoint of a full-pass run resumes
    lazily and the other way round; every other own field of the config is still compared."""
    from trl_variants import APOConfig

    common = dict(output_dir="x", use_cpu=True, report_to="none")
    full = resume_fields(APOConfig(**common))
    assert resume_fields(APOConfig(lazy_value_pass=True, lazy_value_chunk_size=8, **common)) == full
    assert resume_fields(APOConfig(value_beta=0.25, **common)) != full


def test_the_resume_line_names_the_checkpoint_and_its_step(tmp_path):
    TrainerState(global_step=7).save_to_json(str(tmp_path / "trainer_state.json"))
    assert resume_line("DPHTrainer", str(tmp_path), 20) == \
        f"DPHTrainer: resuming from {tmp_path} (after step 7; training continues to step 20)"
    assert resume_line("DPHTrainer", str(tmp_path), -1).endswith("(after step 7; training continues)")


def test_a_composed_run_may_resume_with_its_parts_listed_in_another_order(tmp_path):
    def record(parts):
        return resume_fields(small_config(ComposedConfig, tmp_path, parts=parts, dph_coef=0.2))

    forward = record(["erpo_query_weights", "dph_rehearsal"])
    assert forward == record(["dph_rehearsal", "erpo_query_weights"])  # the order cannot change training
    assert forward != record(["erpo_query_weights"])  # another set of parts can


def test_a_composed_checkpoint_recording_an_option_of_a_part_it_did_not_run_resumes(tmp_path, no_model_load):
    """A record written before dph_coef defaulted to None holds 0.2 for a run without dph_rehearsal; this run holds
    None and may not set 0.2 (an option of a part not in parts is refused): the resume was refused either way. An
    option of a part the run does not hold is not compared; one of a part it holds is."""

    parts = ["erpo_query_kl"]
    old = _config(ComposedConfig, tmp_path, parts=parts)
    record = resume_fields(old)
    assert record["dph_coef"] is None
    path = tmp_path / "checkpoint-1"
    path.mkdir()
    record["dph_coef"] = 0.2  # as the record of an older trl_variants
    TrainerState(stateful_callbacks={TrlVariantsCheckpoint.__name__: {
        "format": RECORD_FORMAT, "trainer": "ComposedTrainer", "config": record, "algorithm_state": {}}}).save_to_json(
        str(path / "trainer_state.json"))
    with pytest.raises(ModelLoaded):  # the checks passed: construction goes on
        _build(ComposedTrainer, _config(ComposedConfig, tmp_path, parts=parts, resume_from_checkpoint=str(path)))
    with pytest.raises(ValueError, match=r"query_kl_coef: checkpoint 0\.01, this run 0\.02"):
        _build(ComposedTrainer, _config(ComposedConfig, tmp_path, parts=parts, query_kl_coef=0.02,
                                        resume_from_checkpoint=str(path)))
