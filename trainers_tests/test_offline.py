"""The offline pass as the trainers run it (``trl_variants._offline``): it scores exactly the prompt ids the trainer
trains on, samples with exactly the trainer's sampling options, and refuses presampled data made otherwise."""

import pytest
import torch

from trl_variants import (
    APOConfig,
    APOTrainer,
    DPHConfig,
    DPHTrainer,
    ERPOConfig,
    ERPOTrainer,
    accuracy_reward,
)
from trl_variants.presample import PresampleConfig, presample, prompt_logps_from_ids

from .helpers import DEFAULT_MODEL_PATH, hinted_tokenizer, small_config, train_dataset

HINT = {"system_hint": "Be brief."}


def _trainer(cls, config_cls, tmp_path, dataset, tokenizer=None, reward=accuracy_reward, **kw):
    return cls(model=DEFAULT_MODEL_PATH, reward_funcs=reward, processing_class=tokenizer,
               args=small_config(config_cls, tmp_path / cls.__name__, **kw), train_dataset=dataset)


def level_one_reward(completions, level, **kwargs):
    """1 for every completion of a level-1 prompt: a D_pef split that does not depend on the model's skill."""
    return [float(x == 1) for x in level]


def test_erpo_reference_pass_scores_the_trainers_own_prompt_ids(tmp_path):
    """With chat_template_kwargs, l_ref(s) is the log-likelihood of the prompt the trainer trains on, so the
    Query-KL is exactly 0 at step 0; scoring the prompt without the kwargs gives another number."""
    ds = train_dataset(8)
    erpo = _trainer(ERPOTrainer, ERPOConfig, tmp_path, ds, hinted_tokenizer(), chat_template_kwargs=HINT)
    ids = [list(x) for x in erpo._tokenize_prompts(list(ds["prompt"]))[0]]
    assert all(len(i) > 45 for i in ids)  # the system line is there
    own = prompt_logps_from_ids(erpo.model, ids, erpo.processing_class.pad_token_id)
    torch.testing.assert_close(torch.tensor(erpo.train_dataset["ref_prompt_logp"]), own, atol=1e-4, rtol=1e-5)
    plain = [erpo.processing_class.apply_chat_template(p, add_generation_prompt=True, tokenize=True,
                                                       return_dict=True)["input_ids"] for p in ds["prompt"]]
    without = prompt_logps_from_ids(erpo.model, plain, erpo.processing_class.pad_token_id)
    assert (own - without).abs().min() > 1.0


@pytest.mark.parametrize("cls,config_cls,kw", [
    (DPHTrainer, DPHConfig, dict(num_presamples=2, pef_threshold=1, max_completion_length=40)),
    (APOTrainer, APOConfig, dict(num_value_samples=2, num_generations=1, max_completion_length=24)),
])
def test_stage1_uses_the_trainers_prompt_ids_and_refuses_other_ones(tmp_path, cls, config_cls, kw):
    ds = train_dataset(16)
    trainer = _trainer(cls, config_cls, tmp_path, ds, hinted_tokenizer(), reward=level_one_reward,
                       chat_template_kwargs=HINT, presample_cache_dir=str(tmp_path / "cache"), **kw)
    want = [list(x) for x in trainer._tokenize_prompts(list(ds["prompt"]))[0]]
    if cls is DPHTrainer:
        got = {i: list(p) for i, p in zip(trainer.pef_dataset["prompt_index"], trainer.pef_dataset["prompt_ids"],
                                          strict=True)}
        assert got and all(p == want[i] for i, p in got.items())
    else:
        assert [list(x) for x in trainer.train_dataset["ref_prompt_ids"]] == want
    # data presampled without the trainer's chat_template_kwargs: other prompts, refused by name
    cfg = PresampleConfig(num_samples=2, max_completion_length=kw["max_completion_length"], value_beta=0.5,
                          record_completion_logps=True, record_prompt_logp=False, show_progress=False,
                          cache_dir=str(tmp_path / "cache2"))
    plain = presample(DEFAULT_MODEL_PATH, None, ds, level_one_reward, cfg)
    if cls is APOTrainer:
        kw = dict(kw, value_beta=0.5)
    with pytest.raises(ValueError, match="ref_prompt_ids.*chat_template_kwargs"):
        _trainer(cls, config_cls, tmp_path / "b", plain, hinted_tokenizer(), reward=level_one_reward,
                 chat_template_kwargs=HINT, **kw)


@pytest.mark.parametrize("option,dataset_value,trainer_value", [
    ("top_p", 0.9, 1.0), ("top_k", 5, 0), ("min_p", 0.05, None), ("repetition_penalty", 1.2, 1.0),
    ("max_completion_length", 16, 24), ("temperature", 0.7, 1.0),
])
def test_apo_refuses_presampled_data_with_other_sampling_options(tmp_path, option, dataset_value, trainer_value):
    """Every option that defines the reference distribution must match (A*-PO checked N and beta1 only)."""
    ds = train_dataset(4)
    options = dict(num_samples=2, value_beta=0.5, max_completion_length=24, record_prompt_logp=False,
                   show_progress=False, cache_dir=str(tmp_path / "cache"))
    options[option] = dataset_value
    presampled = presample(DEFAULT_MODEL_PATH, None, ds, accuracy_reward, PresampleConfig(**options))
    trainer_kw = dict(num_value_samples=2, num_generations=1, max_completion_length=24,
                      per_device_train_batch_size=4)  # one rollout batch: the 4 prompts
    if trainer_value is not None:
        trainer_kw[option] = trainer_value
    with pytest.raises(ValueError, match=f"made with {option}="):
        _trainer(APOTrainer, APOConfig, tmp_path, presampled, **trainer_kw)
    trainer_kw[option] = dataset_value  # the same options: accepted, nothing is sampled again
    apo = _trainer(APOTrainer, APOConfig, tmp_path, presampled, **trainer_kw)
    assert apo.train_dataset["ref_value"] == presampled["ref_value"]


def test_an_evaluation_before_training_returns_its_own_metrics_and_the_pass_logs_with_the_first_step(tmp_path):
    """``evaluate()`` before ``train()`` returned the offline pass's numbers among its metrics (unprefixed), and the
    training log never had them; GRPOTrainer's evaluate returns eval_ metrics and the epoch."""
    from .helpers import small_trainer

    trainer = small_trainer("erpo", tmp_path, max_steps=1, logging_steps=1,
                            trainer_kwargs={"eval_dataset": train_dataset(4, seed=1)})
    metrics = trainer.evaluate()
    assert metrics and all(k.startswith("eval_") or k == "epoch" for k in metrics), sorted(metrics)
    trainer.train()
    first = trainer.state.log_history[0]  # train() starts a new history
    assert "offline_pass/seconds" in first and "loss" in first
