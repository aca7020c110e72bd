import math

import pytest
import torch
from transformers import AutoModelForCausalLM
from trl.experimental.a2po import A2POConfig, A2POTrainer

from trl_variants import APOConfig, APOTrainer, accuracy_reward
from trl_variants.losses import optimal_value
from trl_variants.presample import hf_backend

from ..helpers import CPU_ARGS, DEFAULT_MODEL_PATH, fixed_batch, small_config, train_dataset


def _apo(tmp_path, model=DEFAULT_MODEL_PATH, dataset=None, reward=accuracy_reward, **kw):
    kw.setdefault("num_value_samples", 4)
    kw.setdefault("presample_cache_dir", str(tmp_path / "cache"))
    kw.setdefault("num_generations", 1)
    return APOTrainer(model=model, reward_funcs=reward, args=small_config(APOConfig, tmp_path / "apo", **kw),
                      train_dataset=dataset if dataset is not None else train_dataset(16))


def wrong_on_level_four(completions, solution, level, **kwargs):
    """The accuracy reward, except that every level-4 completion is wrong: prompts all of whose samples are wrong,
    whatever the model samples."""
    return [r if lv < 4 else 0.0 for r, lv in zip(accuracy_reward(completions, solution), level, strict=True)]


def test_num_generations_one_accepted_zero_refused(tmp_path):
    assert APOConfig(output_dir="x", use_cpu=True, bf16=False).num_generations == 1
    with pytest.raises(ValueError, match="num_generations must be >= 1"):
        APOConfig(output_dir="x", use_cpu=True, bf16=False, num_generations=0)
    with pytest.raises(ValueError, match="value_beta"):
        APOConfig(output_dir="x", use_cpu=True, bf16=False, value_beta=0.0)


def test_stage1_values(tmp_path):
    apo = _apo(tmp_path)
    for row in apo.train_dataset:
        assert len(row["ref_rewards"]) == 4
        expected = optimal_value(torch.tensor(row["ref_rewards"]), 0.5).item()
        assert row["ref_value"] == pytest.approx(expected, abs=1e-6)
    values = apo.train_dataset["ref_value"]
    assert 0 < sum(values) / len(values) < 1


def _loss_on_fixed_batch(apo, inputs, rewards, values):
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        ref, _, _ = apo._get_per_token_logps_and_entropies(apo.ref_model, ids, attn, inputs["completion_ids"].size(1))
    batch = dict(inputs, ref_per_token_logps=ref, apo_rewards=rewards, apo_values=values, advantages=rewards - values)
    apo.model.train()
    apo.current_gradient_accumulation_steps = 1
    return apo.compute_loss(apo.model, batch), batch


def test_loss_equals_a2po_formula_and_hand_computation(tmp_path):
    beta2 = 0.5  # large, so the loss is sensitive to the log-ratio term, not only to r - V
    apo = _apo(tmp_path, learning_rate=0.0, beta=beta2)
    inputs, _ = fixed_batch(apo)
    rewards, values = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0.6, 0.6, 0.3, 0.3])
    # move the policy away from the reference so that the log-ratio term is not zero
    with torch.no_grad():
        for p in apo.model.parameters():
            p.add_(0.03 * torch.randn_like(p))
    loss, batch = _loss_on_fixed_batch(apo, inputs, rewards, values)
    # TRL's A2POTrainer formula on the same batch, same reference: full-logit sequence log-probs, no temperature
    a2po = A2POTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward,
                       args=A2POConfig(output_dir=str(tmp_path / "a2po"), beta2=beta2, **{
                           k: v for k, v in CPU_ARGS.items() if k not in ("logging_steps",)}),
                       train_dataset=train_dataset(16))
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    keep = inputs["completion_ids"].size(1)
    with torch.no_grad():
        policy_seq = a2po._get_sequence_logps(apo.model, ids, attn, keep)
        ref_seq = a2po._get_sequence_logps(a2po.ref_model, ids, attn, keep)
    a2po_loss = ((beta2 * (policy_seq - ref_seq) - (rewards - values)) ** 2).mean()
    assert loss.item() == pytest.approx(a2po_loss.item(), rel=1e-5, abs=1e-8)
    seq_ratio = (policy_seq - ref_seq).tolist()
    hand = sum((beta2 * s - (r - v)) ** 2 for s, r, v in zip(seq_ratio, rewards.tolist(), values.tolist(), strict=True)) / 4
    assert loss.item() == pytest.approx(hand, rel=1e-5)
    assert any(abs(beta2 * s) > 0.2 for s in seq_ratio), seq_ratio  # the log-ratio term is really exercised


def test_in_memory_model_reference_is_the_given_weights(tmp_path):
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.9)  # an edited in-memory model: GRPOTrainer would reload the unedited one from disk
    apo = _apo(tmp_path, model=model)
    inputs, _ = fixed_batch(apo)
    loss, batch = _loss_on_fixed_batch(apo, inputs, torch.zeros(4), torch.zeros(4))
    # policy == reference at step 0: log-ratio 0, loss 0
    assert loss.item() == pytest.approx(0.0, abs=1e-10)
    policy = dict(apo.model.named_parameters())
    for name, p in apo.accelerator.unwrap_model(apo.ref_model).named_parameters():
        assert torch.equal(p, policy[name]) and not p.requires_grad


def test_filter_all_incorrect(tmp_path):
    hard = train_dataset(32).filter(lambda lv: lv == 4, input_columns="level")
    with pytest.raises(ValueError, match="dropped all"):
        _apo(tmp_path, dataset=hard.select(range(2)), reward=wrong_on_level_four, filter_all_incorrect=True,
             per_device_train_batch_size=2)
    apo = _apo(tmp_path, reward=wrong_on_level_four, filter_all_incorrect=True)
    assert all(any(r > 0 for r in rs) for rs in apo.train_dataset["ref_rewards"])
    assert 4 not in apo.train_dataset["level"] and len(apo.train_dataset) > 0


def test_filter_all_incorrect_counts_correct_by_threshold_not_above_zero(tmp_path):
    def half_reward(completions, **kw):  # a partial reward on every sample: none is a right answer
        return [0.5] * len(completions)

    with pytest.raises(ValueError, match="dropped all 8 prompts"):  # reward > 0 kept them all before
        _apo(tmp_path, dataset=train_dataset(8), reward=half_reward, filter_all_incorrect=True, num_value_samples=2)
    apo = _apo(tmp_path, dataset=train_dataset(8), reward=half_reward, filter_all_incorrect=True,
               num_value_samples=2, correctness_threshold=0.5)
    assert len(apo.train_dataset) == 8


def test_binary_reward_warning(tmp_path):
    def half_reward(completions, **kw):
        return [0.5] * len(completions)

    with pytest.warns(UserWarning, match=r"binary rewards.*stage 1's reference samples got \[0\.5\], and V_hat"):
        apo = APOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=half_reward,
                         args=small_config(APOConfig, tmp_path, num_value_samples=2,
                                           presample_cache_dir=str(tmp_path / "c")), train_dataset=train_dataset(8))
    apo.model.train()
    with pytest.warns(UserWarning, match="binary rewards"):
        apo._generate_and_score_completions([dict(apo.train_dataset[i]) for i in range(8)])


def test_a_dataset_with_values_alone_is_used_as_it_is(tmp_path, monkeypatch):
    """A ``ref_value`` column turns stage 1 off (docs/trainers.md) with or without the ``ref_rewards`` it was made
    from: the stage-1 binary-reward check has nothing to read then (it raised a KeyError)."""
    monkeypatch.setattr(hf_backend, "generate_completions", lambda *a, **k: pytest.fail("sampled stage 1"))
    values = train_dataset(8).add_column("ref_value", [0.25] * 8)
    apo = _apo(tmp_path, dataset=values)
    assert apo.train_dataset["ref_value"] == [0.25] * 8


@pytest.mark.slow
def test_end_to_end_and_resume_does_not_rerun_stage1(tmp_path, monkeypatch):
    out = tmp_path / "run"
    # 32 prompts: the first batch has prompts whose single sample disagrees with V_hat (a non-zero target), so the
    # first update moves the policy and the second step's KL to the reference is non-zero
    kw = dict(max_steps=2, save_strategy="steps", save_steps=2, output_dir=str(out), learning_rate=1e-3,
              dataset=train_dataset(32))
    apo = _apo(tmp_path, **kw)
    apo.train()
    logged = {k for h in apo.state.log_history for k in h}
    for key in ("apo/regression_loss", "apo/value_mean", "apo/advantage_mean", "apo/seq_log_ratio_mean",
                "reward", "completions/mean_length", "completions/clipped_ratio"):
        assert key in logged, key
    assert "2505.20686" in (out / "README.md").read_text()
    assert any(h.get("apo/seq_log_ratio_mean", 0) != 0 for h in apo.state.log_history)
    assert "kl" not in logged  # GRPO's token-level KL key is not reused for a sequence-level quantity
    monkeypatch.setattr(hf_backend, "generate_completions", lambda *a, **k: pytest.fail("stage 1 ran again"))
    kw.update(max_steps=3)
    resumed = _apo(tmp_path, **kw)
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert resumed.state.global_step == 3 and math.isfinite(resumed.state.log_history[-2]["loss"])


def test_log_ratio_is_taken_at_the_sampling_temperature(tmp_path):
    """Decided from the paper (pi_ref is the distribution the samples come from; the authors'
    ``dp_actor_apo.py`` divides the logits by the rollout temperature for the policy and the reference): at T = 0.7
    the loss uses log softmax(logits / 0.7), which differs from TRL's A2POTrainer's temperature-1 log-probs."""
    T, beta2 = 0.7, 0.5
    apo = _apo(tmp_path, learning_rate=0.0, beta=beta2, temperature=T)
    inputs, _ = fixed_batch(apo)
    rewards, values = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0.6, 0.6, 0.3, 0.3])
    with torch.no_grad():
        for p in apo.model.parameters():
            p.add_(0.03 * torch.randn_like(p))
    loss, _ = _loss_on_fixed_batch(apo, inputs, rewards, values)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    keep, mask = inputs["completion_ids"].size(1), inputs["completion_mask"]

    def seq_logps(model, temperature):
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=attn).logits[:, -keep - 1 : -1].float() / temperature
        return (torch.log_softmax(logits, -1).gather(-1, ids[:, -keep:, None]).squeeze(-1) * mask).sum(-1)

    def formula(temperature):
        ratio = seq_logps(apo.model, temperature) - seq_logps(apo.ref_model, temperature)
        return ((beta2 * ratio - (rewards - values)) ** 2).mean().item()

    assert loss.item() == pytest.approx(formula(T), rel=1e-4)
    assert abs(formula(T) - formula(1.0)) > 1e-3 * abs(formula(1.0))  # the choice matters at this temperature
