import math

import pytest
import torch
from safetensors.torch import load_file
from trl import GRPOConfig

from trl_variants import ERPOConfig, ERPOTrainer, accuracy_reward
from trl_variants.presample import prompt_logps_from_ids

from ..helpers import (
    DEFAULT_MODEL_PATH,
    assert_exactly_grpo,
    assert_same_rollout,
    fixed_batch,
    grpo_trainer,
    loss_and_grads,
    rollouts_with_and_without_query_weights,
    small_config,
    train_dataset,
)

PPO_FAMILY = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo"]


def _erpo(tmp_path, dataset=None, **kw):
    return ERPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward,
                       args=small_config(ERPOConfig, tmp_path / "erpo", **kw),
                       train_dataset=dataset if dataset is not None else train_dataset())


def _plain_prompt_logps(trainer, inputs):
    tok = trainer.processing_class
    rows = [ids[m.bool()].tolist() for ids, m in zip(inputs["prompt_ids"], inputs["prompt_mask"], strict=True)]
    return prompt_logps_from_ids(trainer.model, rows, tok.pad_token_id)


@pytest.mark.parametrize("loss_type", PPO_FAMILY)
def test_both_parts_off_is_exactlygrpo_trainer(tmp_path, loss_type):
    grpo = grpo_trainer(tmp_path, loss_type=loss_type)
    erpo = _erpo(tmp_path, loss_type=loss_type, use_query_weights=False, query_kl_coef=0.0)
    assert erpo.ref_model is None and "ref_prompt_logp" not in erpo.train_dataset.column_names
    inputs, _ = fixed_batch(grpo)
    assert_exactly_grpo(grpo, erpo, inputs)


def test_both_parts_off_rolls_out_exactly_as_grpo(tmp_path):
    """The query weights act on the rollout's advantages, which a fixed batch never reaches: with both parts off
    ERPO has no part and samples and scores the same rollout as GRPOTrainer from the same seed."""
    grpo = grpo_trainer(tmp_path)
    erpo = _erpo(tmp_path, use_query_weights=False, query_kl_coef=0.0)
    assert erpo.parts == []
    assert_same_rollout(grpo, erpo)


def test_query_kl_estimator_k1_reaches_the_loss(tmp_path):
    """``query_kl_estimator="k1"`` (eq. 11 literally): alpha * mean_rows(l_theta - l_ref) is added, not k3's value."""
    alpha = 0.5
    grpo = grpo_trainer(tmp_path)
    erpo = _erpo(tmp_path, use_query_weights=False, query_kl_coef=alpha, query_kl_estimator="k1")
    inputs, _ = fixed_batch(grpo)
    offsets = torch.tensor([0.3, 0.3, -0.2, -0.2])  # d = l_ref - l_theta
    erpo_inputs = dict(inputs, ref_prompt_logps=_plain_prompt_logps(erpo, inputs) + offsets)
    loss_g, _ = loss_and_grads(grpo, inputs)
    loss_e, _ = loss_and_grads(erpo, erpo_inputs)
    assert loss_e.item() - loss_g.item() == pytest.approx(alpha * -sum(offsets.tolist()) / 4, abs=2e-5)  # -0.025


@pytest.mark.parametrize("loss_type", PPO_FAMILY)
def test_query_kl_adds_alpha_times_k3_and_its_gradient(tmp_path, loss_type):
    alpha = 0.5
    grpo = grpo_trainer(tmp_path, loss_type=loss_type)
    erpo = _erpo(tmp_path, loss_type=loss_type, use_query_weights=False, query_kl_coef=alpha)
    inputs, _ = fixed_batch(grpo)
    l_theta = _plain_prompt_logps(erpo, inputs)  # independent plain forward (no fused head)
    offsets = torch.tensor([0.3, 0.3, -0.2, -0.2])
    erpo_inputs = dict(inputs, ref_prompt_logps=l_theta + offsets)  # so d = l_ref - l_theta = offsets

    loss_g, grads_g = loss_and_grads(grpo, inputs)
    loss_e, grads_e = loss_and_grads(erpo, erpo_inputs)
    expected = alpha * sum(math.exp(d) - d - 1 for d in offsets.tolist()) / 4
    assert loss_e.item() - loss_g.item() == pytest.approx(expected, abs=2e-5)

    # gradient of the extra term, from scratch: alpha * mean_rows k3(l_ref - l_theta) through a plain forward
    model = erpo.model
    ids, mask = inputs["prompt_ids"], inputs["prompt_mask"]
    logps = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits[:, :-1], -1)
    logps = logps.gather(-1, ids[:, 1:, None]).squeeze(-1) * (mask[:, 1:] * mask[:, :-1])
    d = erpo_inputs["ref_prompt_logps"] - logps.sum(-1)
    (alpha * (torch.exp(d) - d - 1).mean()).backward()
    for name, p in model.named_parameters():
        # TRL's fused LM-head backward differs from plain autograd by ~1e-4 relative (measured in float64 too);
        # a missing or misplaced Query-KL gradient would be off by ~100 %.
        extra = grads_e[name] - grads_g[name]
        assert (extra - p.grad).norm() <= 1e-3 * p.grad.norm() + 1e-7, name
    assert erpo.ref_model is None  # Query-KL holds no reference model


def test_reference_prompt_logps_equal_policy_at_start(tmp_path):
    erpo = _erpo(tmp_path, use_query_weights=False)
    ds = erpo.train_dataset
    assert "ref_prompt_logp" in ds.column_names
    inputs, _ = fixed_batch(erpo)
    # l_ref was computed from the starting policy: Query-KL is 0 before any update
    first = ds.select([0])["prompt"][0]
    tok = erpo.processing_class
    ids = tok.apply_chat_template([first], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    plain = prompt_logps_from_ids(erpo.model, ids, tok.pad_token_id)
    assert ds[0]["ref_prompt_logp"] == pytest.approx(plain.item(), abs=1e-4)
    assert ds[0]["ref_prompt_logp"] < 0


def test_policy_query_weights_match_hand_computed(tmp_path):
    erpo = _erpo(tmp_path, query_kl_coef=0.0)  # num_generations = 4
    inputs, _ = fixed_batch(erpo, n_prompts=3, group=4)
    erpo.model.train()
    w = erpo.part("erpo_query_weights").weights(erpo, None, inputs)
    logp = _plain_prompt_logps(erpo, inputs)[::4]
    expected = (logp.mean() / logp).repeat_interleave(4)
    torch.testing.assert_close(w, expected, atol=1e-5, rtol=1e-5)
    assert not w.requires_grad


def test_reference_query_weights_from_dataset_column(tmp_path):
    ds = train_dataset(n=16).add_column("ref_prompt_logp", [-10.0, -40.0, -1.0, -20.0] * 4)
    erpo = _erpo(tmp_path, dataset=ds, query_kl_coef=0.0, query_weight_source="reference", query_weight_max=2.0)
    rows = [ds[i] for i in range(4)]
    w = erpo.part("erpo_query_weights").weights(erpo, rows, None)
    torch.testing.assert_close(w, torch.tensor([1.775, 0.44375, 2.0, 0.8875]))  # mean -17.75


def test_advantages_are_multiplied_by_query_weights(tmp_path):
    plain = _erpo(tmp_path, use_query_weights=False, query_kl_coef=0.0)
    weighted = _erpo(tmp_path, query_kl_coef=0.0)
    rollouts_with_and_without_query_weights(plain, weighted)  # same completions, advantages times w(s)


def test_config_validation():
    with pytest.raises(ValueError, match="query_weight_source"):
        ERPOConfig(output_dir="x", query_weight_source="batch", use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match="query_kl_coef"):
        ERPOConfig(output_dir="x", query_kl_coef=-1, use_cpu=True, bf16=False)
    with pytest.raises(TypeError, match="ERPOConfig"):
        ERPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward,
                    args=GRPOConfig(output_dir="x", use_cpu=True, bf16=False))


@pytest.mark.parametrize("options,says", [
    (dict(query_kl_coef=0.0, query_kl_estimator="k1"), "query_kl_estimator='k1' does nothing with query_kl_coef=0"),
    (dict(use_query_weights=False, query_weight_source="reference"),
     "query_weight_source='reference' does nothing with use_query_weights=False"),
    (dict(query_weight_max=3.0), "query_weight_max=3.0 clips only the reference-derived weights"),
    (dict(use_query_weights=False, query_weight_source="reference", query_weight_max=3.0),
     "query_weight_source='reference' does nothing.*; query_weight_max=3.0 clips only"),
])
def test_an_option_that_would_change_nothing_is_refused_naming_it(options, says):
    """An ERPO option set where its part is off would be ignored without a word: refused, naming both fields."""
    with pytest.raises(ValueError, match=says):
        ERPOConfig(output_dir="x", use_cpu=True, bf16=False, **options)
    # the same options where they act are accepted
    ERPOConfig(output_dir="x", use_cpu=True, bf16=False, query_kl_coef=0.0)  # paper ablation "GRPO + w(s)"
    ERPOConfig(output_dir="x", use_cpu=True, bf16=False, query_kl_estimator="k1")
    ERPOConfig(output_dir="x", use_cpu=True, bf16=False, query_weight_source="reference", query_weight_max=3.0)


def _weights(path):
    return load_file(f"{path}/model.safetensors")


@pytest.mark.slow
def test_end_to_end_train_save_reload_resume(tmp_path):
    out = tmp_path / "run"
    args = dict(max_steps=2, save_strategy="steps", save_steps=2, per_device_train_batch_size=16,
                learning_rate=1e-3, output_dir=str(out))
    trainer = ERPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward,
                          args=small_config(ERPOConfig, tmp_path, **args), train_dataset=train_dataset(64))
    trainer.train()
    logged = {k for h in trainer.state.log_history for k in h}
    for key in ("erpo/query_kl", "erpo/query_weight/mean", "erpo/query_weight/min", "erpo/query_weight/max",
                "erpo/prompt_logp/mean", "erpo/policy_prompt_logp/mean", "reward", "entropy", "clip_ratio/region_mean",
                "completions/mean_length"):
        assert key in logged, key
    before, after = _weights(DEFAULT_MODEL_PATH), _weights(out / "checkpoint-2")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    card = (out / "README.md").read_text()  # GRPOTrainer writes the card at every checkpoint
    assert "erpo" in card and "Environmental Regularization" in card

    reloaded = ERPOTrainer(model=str(out / "checkpoint-2"), reward_funcs=accuracy_reward,
                           args=small_config(ERPOConfig, tmp_path / "r", max_steps=1), train_dataset=train_dataset())
    assert torch.equal(reloaded.model.lm_head.weight, after["lm_head.weight"]
                       if "lm_head.weight" in after else after["model.embed_tokens.weight"])

    args.update(max_steps=3)
    resumed = ERPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward,
                          args=small_config(ERPOConfig, tmp_path, **args), train_dataset=train_dataset(64))
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert resumed.state.global_step == 3


@pytest.mark.slow
def test_gradient_accumulation_and_steps_per_generation(tmp_path):
    trainer = _erpo(tmp_path, gradient_accumulation_steps=2, per_device_train_batch_size=8, max_steps=2)
    assert trainer.args.steps_per_generation == 2
    trainer.train()
    qkl = [h["erpo/query_kl"] for h in trainer.state.log_history if "erpo/query_kl" in h]
    assert len(qkl) == 2 and all(math.isfinite(v) for v in qkl)


def length_reward(completions, **kwargs):
    """Dense (never a zero-variance group in practice), so every step has non-zero advantages to train on."""
    return [len(c[0]["content"]) / 64 for c in completions]


@pytest.mark.slow
def test_peft_lora_trains_adapter_only(tmp_path):
    from peft import LoraConfig

    trainer = ERPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=length_reward,
                          args=small_config(ERPOConfig, tmp_path, max_steps=2, learning_rate=1e-2),
                          train_dataset=train_dataset(), peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    base = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora" not in n}
    lora = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    trainer.train()
    params = dict(trainer.model.named_parameters())
    assert all(torch.equal(base[n], params[n]) for n in base)
    assert any(not torch.equal(lora[n], params[n]) for n in lora)
    assert any("erpo/query_kl" in h for h in trainer.state.log_history)
