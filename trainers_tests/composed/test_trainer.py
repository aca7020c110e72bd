"""The composed trainer: each pair of parts gives GRPO's loss plus each part's own terms, computed independently; no
part is GRPOTrainer exactly; every part at once trains (its 2-process == 1-process run is in distributed/)."""

import math

import pytest
import torch

from trl_variants import ComposedConfig, ComposedTrainer, accuracy_reward

from ..erpo.test_trainer import _plain_prompt_logps
from ..helpers import (
    DEFAULT_MODEL_PATH,
    assert_exactly_grpo,
    fixed_batch,
    grpo_trainer,
    loss_and_grads,
    rollouts_with_and_without_query_weights,
    small_config,
    train_dataset,
)
from .options import options_for

DPH_ARGS = dict(num_presamples=2, pef_threshold=2, pef_batch_size=2, divergence="forward_kl", dph_coef=0.5)


def _composed(tmp_path, parts, **kw):
    kw = options_for(parts, {**DPH_ARGS, "query_kl_coef": 0.5, "presample_cache_dir": str(tmp_path / "cache"), **kw})
    return ComposedTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward,
                           args=small_config(ComposedConfig, tmp_path / "-".join(parts or ["none"]), parts=parts,
                                             **kw),
                           train_dataset=train_dataset(16))


def _loss_at_stream_start(trainer, inputs):
    if hasattr(trainer, "_pef_pos"):
        trainer._pef_epoch, trainer._pef_pos = 0, 0  # every trainer rehearses the same D_pef rows
    return loss_and_grads(trainer, inputs)


def test_no_part_is_exactly_grpo(tmp_path):
    grpo = grpo_trainer(tmp_path)
    none = _composed(tmp_path, [])
    inputs, _ = fixed_batch(grpo)
    assert_exactly_grpo(grpo, none, inputs)


def test_query_kl_and_rehearsal_add_their_own_terms(tmp_path):
    """Loss and gradients of (Query-KL + rehearsal) = GRPO's + alpha * mean k3 (by hand) + the rehearsal term of a
    trainer with only that part, on the same batch and the same D_pef rows."""
    grpo = grpo_trainer(tmp_path)
    kl_only = _composed(tmp_path, ["erpo_query_kl"])
    pef_only = _composed(tmp_path, ["dph_rehearsal"])
    both = _composed(tmp_path, ["erpo_query_kl", "dph_rehearsal"])
    assert len(both.pef_dataset) > 0 and both.split_stats == pef_only.split_stats
    for trainer in (pef_only, both):  # stored reference log-probs 0.3 above the policy's: log u = -0.3 per token
        trainer.pef_dataset = trainer.pef_dataset.map(
            lambda ex: {"completion_logps": [x + 0.3 for x in ex["completion_logps"]]})
    inputs, _ = fixed_batch(grpo)
    offsets = torch.tensor([0.3, 0.3, -0.2, -0.2])
    with_ref = dict(inputs, ref_prompt_logps=_plain_prompt_logps(both, inputs) + offsets)  # d = offsets

    loss_g, grads_g = loss_and_grads(grpo, inputs)
    loss_k, grads_k = _loss_at_stream_start(kl_only, with_ref)
    loss_p, grads_p = _loss_at_stream_start(pef_only, inputs)
    loss_b, grads_b = _loss_at_stream_start(both, with_ref)
    kl_term = 0.5 * sum(math.exp(d) - d - 1 for d in offsets.tolist()) / 4
    assert loss_k.item() - loss_g.item() == pytest.approx(kl_term, abs=2e-5)
    pef_term = loss_p.item() - loss_g.item()
    assert pef_term == pytest.approx(0.5 * 0.3, abs=1e-4)  # eta * token mean of -log u (forward KL)
    assert loss_b.item() == pytest.approx(loss_g.item() + kl_term + pef_term, abs=5e-5)
    for name, g in grads_g.items():
        expected = g + (grads_k[name] - g) + (grads_p[name] - g)
        torch.testing.assert_close(grads_b[name], expected, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("other", ["dph_rehearsal", "eepo_two_stage_rollout"])
def test_query_weights_scale_the_advantages_with_another_part(tmp_path, other):
    """With rehearsal (which leaves the rollout alone) or EEPO's two-stage rollout (which makes it): the advantages
    are the other part's own, times w(s) computed by the query-weights part on that output."""
    kw = dict(entropy_gate="always", num_generations=4) if other.startswith("eepo") else {}
    plain = _composed(tmp_path, [other], **kw)
    weighted = _composed(tmp_path, ["erpo_query_weights", other], **kw)
    out_plain, out_weighted = rollouts_with_and_without_query_weights(plain, weighted)
    if other.startswith("eepo"):  # stage 2's old log-probs still come from the unlearned weights
        torch.testing.assert_close(out_weighted["old_per_token_logps"], out_plain["old_per_token_logps"])


def test_eepo_rollout_and_query_kl(tmp_path):
    """EEPO changes the rollout, not the loss on a given batch: with Query-KL the loss is EEPO's plus the KL term."""
    eepo_only = _composed(tmp_path, ["eepo_two_stage_rollout"], entropy_gate="always")
    both = _composed(tmp_path, ["eepo_two_stage_rollout", "erpo_query_kl"], entropy_gate="always")
    inputs, _ = fixed_batch(both)
    offsets = torch.tensor([0.1, 0.1, 0.4, 0.4])
    with_ref = dict(inputs, ref_prompt_logps=_plain_prompt_logps(both, inputs) + offsets)
    loss_e, _ = loss_and_grads(eepo_only, inputs)
    loss_b, _ = loss_and_grads(both, with_ref)
    kl_term = 0.5 * sum(math.exp(d) - d - 1 for d in offsets.tolist()) / 4
    assert loss_b.item() - loss_e.item() == pytest.approx(kl_term, abs=2e-5)


@pytest.mark.slow
def test_every_part_trains_saves_and_resumes(tmp_path):
    out = tmp_path / "run"
    kw = dict(entropy_gate="always", max_steps=2, save_strategy="steps", save_steps=1, output_dir=str(out))
    trainer = _composed(tmp_path, ["erpo_query_weights", "erpo_query_kl", "dph_rehearsal", "eepo_two_stage_rollout"],
                        **kw)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    logged = trainer.state.log_history[0]
    for key in ("erpo/query_weight/mean", "erpo/query_kl", "dph/loss_pef", "eepo/gate"):
        assert math.isfinite(logged[key]), key
    assert logged["eepo/gate"] == 1.0  # entropy_gate="always": every rollout unlearned
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())  # it trained
    position, history = (trainer._pef_epoch, trainer._pef_pos), list(trainer._entropy_history)
    resumed = _composed(tmp_path, ["erpo_query_weights", "erpo_query_kl", "dph_rehearsal", "eepo_two_stage_rollout"],
                        **dict(kw, max_steps=2))
    resumed._load_extra_state({"pef_epoch": 9, "pef_pos": 9, "entropy_history": [9.0]})
    resumed._restore_record(str(out / "checkpoint-2"))
    assert (resumed._pef_epoch, resumed._pef_pos) == position and list(resumed._entropy_history) == history


def test_config_refusals():
    common = dict(output_dir="x", use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match="unknown part"):
        ComposedConfig(parts=["apo"], **common)
    with pytest.raises(ValueError, match="query_kl_coef is 0"):
        ComposedConfig(parts=["erpo_query_kl"], query_kl_coef=0.0, **common)
    with pytest.raises(ValueError, match="entropy_gate='never'"):
        ComposedConfig(parts=["eepo_two_stage_rollout"], entropy_gate="never", **common)


def _distinct_accuracy(completions, **kwargs):
    """Accuracy plus a different 1e-3 step per row: a signal in every group (dynamic sampling keeps them all), and
    DPH-RL's offline split still finds near-perfect prompts."""
    return [a + i * 1e-3 for i, a in enumerate(accuracy_reward(completions, **kwargs))]


@pytest.mark.parametrize("other", ["erpo_query_weights", "erpo_query_kl", "dph_rehearsal", "eepo_two_stage_rollout"])
def test_dynamic_sampling_with_another_part_adds_no_term_and_keeps_a_full_batch_as_is(tmp_path, other):
    """Dynamic sampling has no loss term: with a signal in every group, (part + dynamic sampling) trains the very
    weights of the part alone (bit for bit) and its own metrics say one round, every group kept."""
    kw = dict(max_steps=1, entropy_gate="always") if other.startswith("eepo") else dict(max_steps=1)
    def build(parts):
        return ComposedTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=_distinct_accuracy,
                               args=small_config(ComposedConfig, tmp_path / "-".join(parts), parts=parts,
                                                 **options_for(parts, {**DPH_ARGS, "query_kl_coef": 0.5, **kw,
                                                                       "presample_cache_dir": str(tmp_path / "cache")})),
                               train_dataset=train_dataset(16))

    if other == "dph_rehearsal":  # the first construction samples the offline pass (drawing random numbers), later
        build([other])            # ones read its cache: both compared runs must read it
    runs = {}
    for parts in ([other], [other, "dapo_dynamic_sampling"]):
        runs[len(parts)] = build(parts)
        runs[len(parts)].train()
    alone, both = (dict(runs[n].model.named_parameters()) for n in (1, 2))
    assert all(torch.equal(alone[n], both[n]) for n in alone)
    logged = {k: v for h in runs[2].state.log_history for k, v in h.items()}
    assert logged["dynamic_sampling/rounds"] == 1.0 and logged["dynamic_sampling/kept_fraction"] == 1.0
