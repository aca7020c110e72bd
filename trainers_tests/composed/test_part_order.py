"""The order of the parts does not change training: the parts return named loss terms and the trainer combines them
(``loss_combination``) in one order of its own. Compared exactly (==): the trainer computes and adds the terms in
the order of their names whatever the list's order, so every order runs the very same floating-point operations.
Each ``loss_combination`` checked against its formula."""

import itertools

import pytest
import torch

from trl_variants import ComposedConfig, ComposedTrainer, accuracy_reward

from ..erpo.test_trainer import _plain_prompt_logps
from ..helpers import DEFAULT_MODEL_PATH, fixed_batch, loss_and_grads, small_config, train_dataset
from .options import options_for

PARTS = ("erpo_query_weights", "erpo_query_kl", "dph_rehearsal", "eepo_two_stage_rollout")
OPTIONS = dict(num_presamples=2, pef_threshold=2, pef_batch_size=2, divergence="forward_kl", dph_coef=0.5,
               query_kl_coef=0.5, entropy_gate="always", max_completion_length=16)


def _composed(tmp_path, parts, reward_funcs=accuracy_reward, **kw):
    trainer = ComposedTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=reward_funcs,
                              args=small_config(ComposedConfig, tmp_path / "-".join(parts), parts=list(parts),
                                                **options_for(parts, {**OPTIONS, **kw, "presample_cache_dir":
                                                                      str(tmp_path / "cache")})),
                              train_dataset=train_dataset(16))
    if "dph_rehearsal" in parts:  # stored reference log-probs 0.3 above the policy's: a D_pef term that is not 0
        trainer.pef_dataset = trainer.pef_dataset.map(
            lambda ex: {"completion_logps": [x + 0.3 for x in ex["completion_logps"]]})
    return trainer


def _batch(trainer):
    inputs, _ = fixed_batch(trainer)
    offsets = torch.tensor([0.3, 0.3, -0.2, -0.2])  # l_ref - l_theta: a Query-KL term that is not 0
    return dict(inputs, ref_prompt_logps=_plain_prompt_logps(trainer, inputs) + offsets)


def _loss(trainer, inputs):
    trainer._pef_epoch, trainer._pef_pos = 0, 0  # every order rehearses the same D_pef rows
    return loss_and_grads(trainer, inputs)


def _assert_same(a, b):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    assert torch.equal(loss_a, loss_b), (loss_a.item(), loss_b.item())
    assert grads_a.keys() == grads_b.keys() and all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)


def test_every_order_of_the_parts_gives_the_same_loss_and_gradients(tmp_path):
    """All 24 orders of ERPO's two parts, DPH-RL's rehearsal and EEPO's rollout on one fixed batch (the same D_pef
    rows), with each ``loss_combination``: the same loss and gradients, bit for bit; also from a trainer built with
    the reversed list."""
    trainer = _composed(tmp_path, PARTS)
    reversed_list = _composed(tmp_path, PARTS[::-1])
    inputs = _batch(trainer)
    by_name = {p.name: p for p in trainer.parts}
    for combination in ("sum", "count_weighted"):
        trainer.args.loss_combination = reversed_list.args.loss_combination = combination
        trainer.parts = [by_name[name] for name in PARTS]
        first = _loss(trainer, inputs)
        for order in itertools.permutations(PARTS):
            trainer.parts = [by_name[name] for name in order]
            _assert_same(first, _loss(trainer, inputs))
        _assert_same(first, _loss(reversed_list, inputs))


def test_loss_combinations(tmp_path):
    """``sum``: L_exp + eta L_pef, L_exp = GRPO's loss + the Query-KL term (DPH-RL's eq. 7); ``count_weighted``:
    (n_exp L_exp + n_pef eta L_pef) / (n_exp + n_pef), n the rows of each batch. The terms are read from their
    logs (``loss/<name>``), L_exp from DPH-RL's ``dph/loss_exp``. With every term on the rollout batch the two are
    the same loss."""
    trainer = _composed(tmp_path, ["erpo_query_kl", "dph_rehearsal"])
    inputs = _batch(trainer)
    out = {}
    for combination in ("sum", "count_weighted"):
        trainer.args.loss_combination = combination
        trainer._metrics["train"].clear()
        loss, grads = _loss(trainer, inputs)
        logged = {k: v[-1] for k, v in trainer._metrics["train"].items()}
        out[combination] = loss.item(), logged
    (total, logged), (weighted, _) = out["sum"], out["count_weighted"]
    pef, kl, exp = logged["loss/dph_pef"], logged["loss/erpo_query_kl"], logged["dph/loss_exp"]
    assert pef > 0.1 and kl > 0.01
    n_exp, n_pef = 4, 2  # fixed_batch's rows, pef_batch_size
    assert total == pytest.approx(exp + pef, abs=1e-6)
    assert weighted == pytest.approx((n_exp * exp + n_pef * pef) / (n_exp + n_pef), abs=1e-6)
    assert weighted != pytest.approx(total, abs=1e-3)
    kl_only = _composed(tmp_path, ["erpo_query_kl"])
    for combination in ("sum", "count_weighted"):
        kl_only.args.loss_combination = combination
        out[combination] = _loss(kl_only, inputs)
    _assert_same(out["sum"], out["count_weighted"])


def _dense_accuracy(completions, **kwargs):
    """Accuracy plus 0.1 for a completion longer than 40 characters: some groups have a signal, some not (dynamic
    sampling refills), and DPH-RL's split still finds near-perfect prompts."""
    return [a + 0.1 * (len(str(c)) > 40) for a, c in zip(accuracy_reward(completions, **kwargs), completions,
                                                        strict=True)]


@pytest.mark.slow
def test_orders_train_the_same_with_dynamic_sampling(tmp_path):
    """One training step of every part with dynamic sampling, the parts in three orders (dynamic sampling first,
    in the middle, last): the same logs and the same weights, bit for bit."""
    orders = [(*PARTS, "dapo_dynamic_sampling"), ("dapo_dynamic_sampling", *PARTS[::-1]),
              ("dph_rehearsal", "eepo_two_stage_rollout", "dapo_dynamic_sampling", "erpo_query_kl",
               "erpo_query_weights")]
    runs = []
    for order in orders:
        trainer = _composed(tmp_path, order, reward_funcs=_dense_accuracy, max_steps=1,
                            loss_combination="count_weighted", dynamic_sampling_max_rounds=2)
        # l_ref 0.3 above the starting policy's: a Query-KL term with a gradient at the first step
        trainer.train_dataset = trainer.train_dataset.map(lambda ex: {"ref_prompt_logp": ex["ref_prompt_logp"] + 0.3})
        trainer.train()
        runs.append(trainer)
    logs = [{k: v for h in t.state.log_history for k, v in h.items() if k not in ("train_runtime", "step_time")
             and not k.endswith("_per_second") and k != "offline_pass/seconds"} for t in runs]
    weights = [dict(t.model.named_parameters()) for t in runs]
    for log, w in zip(logs[1:], weights[1:], strict=True):
        assert log == logs[0]
        assert all(torch.equal(w[n], weights[0][n]) for n in w)
    assert logs[0]["dynamic_sampling/rounds"] == 2 and logs[0]["eepo/gate"] == 1.0  # it refilled; EEPO unlearned
    assert logs[0]["loss/dph_pef"] > 0.01 and logs[0]["loss/erpo_query_kl"] > 0.001
