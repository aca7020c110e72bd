import math

import pytest
import torch
from datasets import load_from_disk

from trl_variants import DPHConfig, DPHTrainer, accuracy_reward
from trl_variants.losses import f_divergence
from trl_variants.presample import hf_backend
from trl_variants.presample import runner as ps

from ..helpers import (
    DEFAULT_MODEL_PATH,
    assert_exactly_grpo,
    fixed_batch,
    grpo_trainer,
    loss_and_grads,
    run_two_ranks,
    small_config,
    train_dataset,
)


def _dph(tmp_path, dataset=None, **kw):
    kw.setdefault("num_presamples", 4)
    kw.setdefault("pef_threshold", 4)
    kw.setdefault("presample_cache_dir", str(tmp_path / "cache"))
    kw.setdefault("max_completion_length", 40)
    return DPHTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward,
                      args=small_config(DPHConfig, tmp_path / "dph", **kw),
                      train_dataset=dataset if dataset is not None else train_dataset(48))


def test_split_and_no_reference_model(tmp_path):
    dph = _dph(tmp_path)
    assert dph.ref_model is None  # generator form: the reference is only the stored log-probs
    stats = dph.split_stats
    assert stats["num_pef_prompts"] > 0 and stats["num_exp_prompts"] > 0  # the tiny model solves level 1 reliably
    assert stats["num_pef_prompts"] + stats["num_exp_prompts"] == 48
    assert len(dph.train_dataset) == stats["num_exp_prompts"] and "ref_rewards" not in dph.train_dataset.column_names
    assert len(dph.pef_dataset) == stats["num_pef_rows"] == 4 * stats["num_pef_prompts"]  # "4 of 4", keep all


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_eta_zero_is_exactly_grpo(tmp_path, loss_type):
    grpo = grpo_trainer(tmp_path, loss_type=loss_type)
    dph = _dph(tmp_path, loss_type=loss_type, dph_coef=0.0)
    inputs, _ = fixed_batch(grpo)
    assert_exactly_grpo(grpo, dph, inputs)


def _pef_term_only(tmp_path, eta):
    """A forward-KL DPH-RL trainer (``eta``) with its D_pef stream at the start, one with eta 0, and a fixed batch of
    zero advantages: their losses differ by the D_pef term alone. Also the stream's first two rows (one micro-step's
    batch)."""
    dph = _dph(tmp_path, dph_coef=eta, divergence="forward_kl", pef_batch_size=2)
    zero = _dph(tmp_path, dph_coef=0.0)
    inputs, _ = fixed_batch(dph)
    inputs = dict(inputs, advantages=torch.zeros_like(inputs["advantages"]))  # isolate the D_pef term
    dph._pef_epoch, dph._pef_pos = 0, 0
    return dph, zero, inputs, dph.part("dph_rehearsal")._pef_order(dph, 0)[:2]


def test_pef_term_value_and_gradient_direction(tmp_path):
    eta = 0.5
    dph, zero, inputs, rows = _pef_term_only(tmp_path, eta)
    # Pretend pi_theta already moved away from the stored completions: stored log-probs 0.3 above the current ones
    batch = dph.pef_dataset.select(rows)
    ids, attn, ref, mask, C = dph.part("dph_rehearsal")._pef_tensors(dph, batch)
    with torch.no_grad():
        current, _, _ = dph._get_per_token_logps_and_entropies(dph.model, ids, attn, C)
    shifted = [[x + 0.3 for x in r] for r in batch["completion_logps"]]
    dph.pef_dataset = dph.pef_dataset.map(
        lambda ex, i: {"completion_logps": shifted[rows.index(i)] if i in rows else ex["completion_logps"]},
        with_indices=True)
    loss_z, _ = loss_and_grads(zero, inputs)
    loss_d, grads_d = loss_and_grads(dph, inputs)
    # forward-KL generator f(u) = -log u = 0.3 on every stored token (current - stored = -0.3): eta * 0.3 added
    assert loss_d.item() - loss_z.item() == pytest.approx(eta * 0.3, abs=1e-4)
    # one gradient-descent step on the loss raises pi_theta on the stored completions (u moves toward 1)
    with torch.no_grad():
        for name, p in dph.model.named_parameters():
            p.sub_(1e-3 * grads_d[name])
        after, _, _ = dph._get_per_token_logps_and_entropies(dph.model, ids, attn, C)
    assert ((after - current) * mask).sum() > 0
    assert (f_divergence(after - current - 0.3, "forward_kl") * mask).sum() < (0.3 * mask).sum()


def test_pef_term_follows_the_configured_divergence(tmp_path):
    """Each ``divergence`` (and ``divergence_alpha``) of the config reaches the D_pef term: every stored token 0.3
    above the current log-prob (log u = -0.3) adds eta * f(u), with f from DPH-RL's Table 5 written out here."""
    eta, lu = 0.5, -0.3
    u = math.exp(lu)
    table5 = {
        "reverse_kl": u * lu,
        "js": u * lu / 2 - (u + 1) / 2 * math.log((u + 1) / 2),
        "alpha": (u ** (1 - 0.5) - (1 - 0.5) * u - 0.5) / (0.5 * (0.5 - 1)),  # divergence_alpha 0.5, not 0.2
        "forward_kl_k3": u - lu - 1,
    }
    zero = _dph(tmp_path, dph_coef=0.0)
    inputs, _ = fixed_batch(zero)
    inputs = dict(inputs, advantages=torch.zeros_like(inputs["advantages"]))  # isolate the D_pef term
    loss_z, _ = loss_and_grads(zero, inputs)
    for divergence, f in table5.items():
        extra = {"divergence_alpha": 0.5} if divergence == "alpha" else {}
        dph = _dph(tmp_path, dph_coef=eta, divergence=divergence, pef_batch_size=2, **extra)
        dph._pef_epoch, dph._pef_pos = 0, 0
        dph.pef_dataset = dph.pef_dataset.map(lambda ex: {"completion_logps": [x - lu for x in ex["completion_logps"]]})
        loss_d, _ = loss_and_grads(dph, inputs)
        assert loss_d.item() - loss_z.item() == pytest.approx(eta * f, abs=1e-4), divergence


def test_pef_term_is_the_token_mean_of_the_rehearsed_batch(tmp_path):
    """Eq. 6's L_pef averages f over the tokens of the D_pef batch: two rows of different lengths, one moved 0.3
    and one 0.1 away from their stored log-probs, give eta * (0.3 L0 + 0.1 L1) / (L0 + L1), not the mean of the
    rows' means (eta * 0.2) nor a sum."""
    eta = 0.5
    dph, zero, inputs, rows = _pef_term_only(tmp_path, eta)
    full = [len(r) for r in dph.pef_dataset.select(rows)["completion_logps"]]
    lengths = [max(1, full[1] // 3), full[1]]  # the first row cut to a third of the second's length
    shift = {rows[0]: 0.3, rows[1]: 0.1}

    def edit(ex, i):
        if i == rows[0]:  # a stored completion's prefix, with its log-probs (causal: the same values)
            ex = dict(ex, completion_ids=ex["completion_ids"][: lengths[0]],
                      completion_logps=ex["completion_logps"][: lengths[0]])
        if i in shift:
            ex = dict(ex, completion_logps=[x + shift[i] for x in ex["completion_logps"]])
        return ex

    dph.pef_dataset = dph.pef_dataset.map(edit, with_indices=True)
    batch = dph.pef_dataset.select(rows)
    assert [len(r) for r in batch["completion_ids"]] == lengths and lengths[0] < lengths[1]
    *_, mask, _ = dph.part("dph_rehearsal")._pef_tensors(dph, batch)
    assert mask.sum(1).tolist() == lengths
    loss_z, _ = loss_and_grads(zero, inputs)
    loss_d, _ = loss_and_grads(dph, inputs)
    expected = eta * (0.3 * lengths[0] + 0.1 * lengths[1]) / sum(lengths)  # f = -log u = the shift, per token
    assert abs(expected - eta * 0.2) > 1e-2  # the row mean would be told apart
    assert loss_d.item() - loss_z.item() == pytest.approx(expected, abs=1e-4)


def test_empty_pef_errors_or_falls_back(tmp_path):
    few = train_dataset(16).filter(lambda lv: lv == 4, input_columns="level")  # hard prompts only
    with pytest.raises(ValueError, match="D_pef is empty"):
        _dph(tmp_path, dataset=few, require_pef=True, per_device_train_batch_size=4)
    with pytest.warns(UserWarning, match="runs as GRPO without KL"):
        dph = _dph(tmp_path, dataset=few, per_device_train_batch_size=4)
    assert len(dph.pef_dataset) == 0


def test_uses_presampled_dataset_without_generating(tmp_path, monkeypatch):
    dph = _dph(tmp_path)
    saved = tmp_path / "presampled"
    ds = ps.presample(dph.model, dph.processing_class, train_dataset(48), accuracy_reward,
                      dph.part("dph_rehearsal")._presample_config(dph, 4, 0))
    ds.save_to_disk(str(saved))
    monkeypatch.setattr(hf_backend, "generate_completions", lambda *a, **k: pytest.fail("generated again"))
    again = _dph(tmp_path / "2", dataset=load_from_disk(str(saved)))
    assert again.split_stats == dph.split_stats
    with pytest.raises(ValueError, match="num_samples=4 but the trainer is configured with 8"):
        _dph(tmp_path / "3", dataset=load_from_disk(str(saved)), num_presamples=8, pef_threshold=8)


def test_config_validation():
    common = dict(output_dir="x", use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match="beta must be 0"):
        DPHConfig(beta=0.04, divergence_form="definition", **common)
    assert DPHConfig(beta=0.04, **common).beta == 0.04  # generator form: GRPO's KL on D_exp, an addition (off: 0)
    with pytest.raises(ValueError, match="pef_threshold"):
        DPHConfig(num_presamples=4, pef_threshold=5, **common)
    assert DPHConfig(per_device_train_batch_size=16, **common).pef_batch_size == 2  # 1 : 8


@pytest.mark.parametrize(("divergence", "eta"), [("js", 0.2), ("forward_kl", 0.01), ("alpha", 0.01),
                                                   ("forward_kl_k3", 0.01), ("reverse_kl", 0.01)])
def test_eta_defaults_to_the_papers_value_for_the_divergence(divergence, eta):
    """Table 6: eta 0.2 for DPH-JS, 0.01 for DPH-F and the alpha-divergence (a fixed 0.2 was 20 times the paper's
    for forward-KL); a value given is kept."""
    common = dict(output_dir="x", use_cpu=True, bf16=False)
    assert DPHConfig(divergence=divergence, **common).dph_coef == eta
    assert DPHConfig(divergence=divergence, dph_coef=0.3, **common).dph_coef == 0.3


def test_correctness_reward_may_be_the_function_itself():
    """A TRL user passes reward functions, not names: the function was refused with "is not one of the reward
    functions ['accuracy_reward', 'format_reward']" although it was; it is stored as the name TRL gives it."""
    import functools

    from trl_variants import format_reward

    common = dict(output_dir="x", use_cpu=True, bf16=False)
    assert DPHConfig(correctness_reward=format_reward, **common).correctness_reward == "format_reward"
    assert DPHConfig(correctness_reward=functools.partial(format_reward), **common).correctness_reward == "format_reward"
    assert DPHConfig(correctness_reward="format_reward", **common).correctness_reward == "format_reward"


@pytest.mark.slow
def test_end_to_end_train_save_resume_continues_pef_stream(tmp_path):
    out = tmp_path / "run"
    kw = dict(max_steps=2, save_strategy="steps", save_steps=2, output_dir=str(out))
    dph = _dph(tmp_path, **kw)
    dph.train()
    logged = {k for h in dph.state.log_history for k in h}
    for key in ("dph/loss_exp", "dph/loss_pef", "dph/log_u_mean", "dph/num_pef_rows", "dph/num_exp_prompts",
                "reward", "entropy"):
        assert key in logged, key
    position = (dph._pef_epoch, dph._pef_pos)
    assert position != (0, 0)
    assert "dph-rl" in (out / "README.md").read_text() and "2509.07430" in (out / "README.md").read_text()
    kw.update(max_steps=3)
    resumed = _dph(tmp_path, **kw)
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert resumed.state.global_step == 3
    expected = _dph(tmp_path, **kw)  # where the stream stands after one more micro-step from the saved position
    expected._pef_epoch, expected._pef_pos = position
    expected.part("dph_rehearsal").next_pef_batch(expected)
    assert (resumed._pef_epoch, resumed._pef_pos) == (expected._pef_epoch, expected._pef_pos)


def _js_exp_term_only(tmp_path):
    """GRPOTrainer and a definition-form DPH-RL trainer with eta 0 (their losses differ by the D_exp term alone), a
    fixed batch, and its rows' ids, attention mask and current completion log-probs."""
    grpo = grpo_trainer(tmp_path)
    dph = _dph(tmp_path, divergence_form="definition", dph_coef=0.0)  # isolate the D_exp term
    inputs, _ = fixed_batch(grpo)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        current, _, _ = dph._get_per_token_logps_and_entropies(dph.model, ids, attn, inputs["completion_ids"].size(1))
    return grpo, dph, inputs, (ids, attn, current)


def test_definition_form_js_with_live_reference(tmp_path):
    grpo, dph, inputs, (ids, attn, current) = _js_exp_term_only(tmp_path)
    assert dph.ref_model is not None
    assert dph.js_beta1 == 0.0
    dph.js_beta1 = 0.5
    ref = current - 0.4  # u = e^0.4 on every rollout token
    loss_g, _ = loss_and_grads(grpo, inputs)
    loss_d, _ = loss_and_grads(dph, dict(inputs, ref_per_token_logps=ref))
    u = math.exp(0.4)
    expected = 0.5 * (0.4 - math.log((1 + u) / 2))  # beta1 * KL(pi || M) per token
    assert loss_d.item() - loss_g.item() == pytest.approx(expected, abs=1e-5)
    with pytest.raises(ValueError, match="divergence='js'"):
        DPHConfig(output_dir="x", use_cpu=True, bf16=False, divergence="forward_kl", divergence_form="definition")


def test_definition_form_js_is_a_token_mean_over_the_rollouts(tmp_path):
    """beta1 * KL(pi || M) on D_exp averages over the rollout tokens: rows of different lengths moved by different
    amounts from the reference give the length-weighted mean of the per-row values."""
    grpo, dph, inputs, (ids, attn, current) = _js_exp_term_only(tmp_path)
    dph.js_beta1 = 0.5
    shifts = [0.8, 0.1, 0.4, 0.2]  # log u on every token of each row
    ref = current - torch.tensor(shifts)[:, None]
    lengths = inputs["completion_mask"].sum(1).tolist()
    assert len(set(lengths)) > 1
    loss_g, grads_g = loss_and_grads(grpo, inputs)
    loss_d, grads_d = loss_and_grads(dph, dict(inputs, ref_per_token_logps=ref))
    per_token = [c - math.log((1 + math.exp(c)) / 2) for c in shifts]  # KL(pi || M) at log u = c
    expected = 0.5 * sum(n * k for n, k in zip(lengths, per_token, strict=True)) / sum(lengths)
    assert abs(expected - 0.5 * sum(per_token) / 4) > 1e-3  # the mean of the rows' means would be told apart
    assert loss_d.item() - loss_g.item() == pytest.approx(expected, abs=1e-5)
    # its gradient, on the policy's own samples: d/dlog pi of the per-token value, 1 / (1 + u), plus the
    # score-function term, the value itself (losses.on_policy_sample_loss), each token weighted 0.5 / tokens
    weights = torch.tensor([1 / (1 + math.exp(c)) + k for c, k in zip(shifts, per_token, strict=True)])[:, None]
    weights = 0.5 * weights * inputs["completion_mask"] / sum(lengths)
    dph.model.zero_grad(set_to_none=True)
    logps, _, _ = dph._get_per_token_logps_and_entropies(dph.model, ids, attn, inputs["completion_ids"].size(1))
    (weights * logps).sum().backward()
    for name, p in dph.model.named_parameters():
        # the fused LM-head kernel against autograd through it: ~1e-4 relative (test_query_kl_adds_alpha_times_k3)
        torch.testing.assert_close(grads_d[name] - grads_g[name], p.grad, rtol=1e-3, atol=1e-6, msg=name)


@pytest.mark.slow
def test_definition_form_trains(tmp_path):
    dph = _dph(tmp_path, divergence_form="definition", max_steps=2)
    assert dph.js_beta1 == pytest.approx(0.2 * len(dph.pef_dataset) / len(dph.train_dataset))
    dph.train()
    logged = {k for h in dph.state.log_history for k in h}
    assert {"dph/js_exp_term", "dph/loss_pef"} <= logged


@pytest.mark.slow
def test_two_process_ddp_keeps_ranks_in_sync(tmp_path):
    """Two forwards (rollouts, D_pef batch), one backward per micro-step under DDP: ranks stay identical."""
    script = tmp_path / "ddp.py"
    script.write_text(f"""
import torch
torch.set_num_threads(1)
from accelerate.utils import gather_object
from trl_variants import DPHConfig, DPHTrainer, accuracy_reward, load_default_dataset
from trl_variants.default import DEFAULT_MODEL_PATH
args = DPHConfig(output_dir={str(tmp_path / 'out')!r}, use_cpu=True, bf16=False, gradient_checkpointing=False,
                 report_to="none", save_strategy="no", per_device_train_batch_size=8, num_generations=4,
                 max_completion_length=32, max_steps=2, num_presamples=4, pef_threshold=4, pef_batch_size=2,
                 learning_rate=1e-3, presample_cache_dir={str(tmp_path / 'cache')!r}, disable_tqdm=True)
t = DPHTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, args=args,
               train_dataset=load_default_dataset(48, 4)["train"])
assert t.accelerator.num_processes == 2 and len(t.pef_dataset) > 0
t.train()
digests = gather_object([float(sum(p.double().sum() for p in t.model.parameters()))])
assert digests[0] == digests[1], digests
assert any("dph/loss_pef" in h for h in t.state.log_history)
print("OK", digests)
""")
    run_two_ranks(script, 29553)


def test_correctness_is_the_accuracy_reward_not_the_summed_reward(tmp_path):
    """With accuracy + format rewards, a well-formatted wrong answer is not "correct": D_pef holds only completions
    whose accuracy reward is 1 (the summed reward is > 0 for every formatted completion)."""
    from trl_variants import format_reward

    ds = train_dataset(24)
    dph = DPHTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=[accuracy_reward, format_reward],
                     args=small_config(DPHConfig, tmp_path / "dph", num_presamples=4, pef_threshold=1,
                                       max_completion_length=40, presample_cache_dir=str(tmp_path / "c")),
                     train_dataset=ds)
    tok = dph.processing_class
    texts = tok.batch_decode(list(dph.pef_dataset["completion_ids"]), skip_special_tokens=True)
    gold = [ds[i]["solution"] for i in dph.pef_dataset["prompt_index"]]
    assert len(texts) > 0
    assert accuracy_reward(texts, gold) == [1.0] * len(texts)
    # the summed reward would have let in wrong but formatted completions: there are some in this pass
    assert format_reward(texts) == [1.0] * len(texts)
    with pytest.raises(ValueError, match="correctness_reward='nope' is not one of"):
        _dph(tmp_path / "x", correctness_reward="nope")
    with pytest.raises(ValueError, match="set correctness_reward"):
        DPHTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=[format_reward, format_reward],
                   args=small_config(DPHConfig, tmp_path / "y", num_presamples=2, pef_threshold=1),
                   train_dataset=ds)


def test_reference_samples_do_not_depend_on_the_per_device_batch(tmp_path):
    """The same global run on 1 process (16 rows per device) and on 2 (8 rows per device) must rehearse the same
    reference samples: the pass's layout is fixed, not derived from per_device_train_batch_size.
    Each run gets its own cache, so both really sample."""
    a = _dph(tmp_path / "a", per_device_train_batch_size=16, dataset=train_dataset(24))
    b = _dph(tmp_path / "b", per_device_train_batch_size=8, dataset=train_dataset(24))
    assert len(a.pef_dataset) > 0
    assert a.pef_dataset.to_dict() == b.pef_dataset.to_dict()
    assert a.train_dataset["prompt"] == b.train_dataset["prompt"]


def test_pef_stream_is_one_global_stream_whatever_the_process_count(tmp_path):
    """Seven rehearsal rows (odd), two rows per process per micro-step: on 2 processes each micro-step rehearses
    exactly the 4 rows the 1-process stream (4 rows per micro-step) rehearses, wrapping into the next epoch at the
    same row, and both processes hold the same stream position."""
    from types import SimpleNamespace

    from datasets import Dataset

    dph = _dph(tmp_path)
    dph.pef_dataset = Dataset.from_dict({"row": list(range(7))})
    real = dph.accelerator

    def stream(world, rank, per_process, steps):
        dph.accelerator = SimpleNamespace(num_processes=world, process_index=rank)
        dph.args.pef_batch_size = per_process
        dph._pef_epoch, dph._pef_pos = 0, 0
        try:
            return [list(dph.part("dph_rehearsal").next_pef_batch(dph)["row"]) for _ in range(steps)], (dph._pef_epoch, dph._pef_pos)
        finally:
            dph.accelerator = real

    one, end_one = stream(1, 0, 4, steps=5)
    rank0, end0 = stream(2, 0, 2, steps=5)
    rank1, end1 = stream(2, 1, 2, steps=5)
    assert [a + b for a, b in zip(rank0, rank1, strict=True)] == one
    assert end0 == end1 == end_one == (2, 6)  # 20 rows drawn from epochs of 7: two wraps, 6 rows into the third
    assert sorted(one[0] + one[1][:3]) == list(range(7))  # an epoch is a permutation of all rows
