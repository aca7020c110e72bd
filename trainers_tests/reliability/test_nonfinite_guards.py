"""Non-finite gradients, weights and logits stop training with a message naming the step, before the damage spreads
(trl_variants/_numerics.py). Without the guards, one non-finite gradient is clipped into NaN gradients everywhere
(``max_grad_norm / nan``), the update makes every weight NaN, and the next rollout dies inside ``generate`` ("probability
tensor contains either inf, nan or element < 0": on CUDA a device-side assert), as a bf16 GPU run did at step 86."""

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from ..helpers import TRAINERS, small_trainer

# EEPO's unlearning step is an update of its own inside the rollout: keep its gate closed so step 1 is GRPO's update
_NO_GATE = {"eepo": {"entropy_gate": "never"}}


def _trainer(method, tmp_path, **kw):
    return small_trainer(method, tmp_path, max_steps=2, **_NO_GATE.get(method, {}), **kw)


def _weights(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def _assert_unchanged(trainer, before):
    for name, value in before.items():
        assert torch.equal(dict(trainer.model.named_parameters())[name].detach(), value), name


@pytest.mark.parametrize("method", list(TRAINERS))
def test_nan_gradient_stops_training_before_the_update(tmp_path, method):
    trainer = _trainer(method, tmp_path)
    layer = trainer.model.model.layers[0].mlp.down_proj.weight  # one NaN gradient entry, the loss stays finite
    layer.register_hook(lambda g: g.index_put((torch.tensor([0]), torch.tensor([0])), torch.tensor(float("nan"))))
    before = _weights(trainer)
    with pytest.raises(FloatingPointError, match=rf"{type(trainer).__name__}: non-finite gradients at optimizer step 1 "
                                                 r"\(on 1 process\(es\)\) although the loss was finite.*lower "
                                                 "learning_rate"):
        trainer.train()
    _assert_unchanged(trainer, before)  # the optimizer never applied the NaN gradients


@pytest.mark.parametrize("method", list(TRAINERS))
def test_update_that_makes_weights_nonfinite_stops_before_the_next_rollout(tmp_path, method):
    trainer = _trainer(method, tmp_path)
    weight = trainer.model.model.layers[0].mlp.up_proj.weight
    rollouts = []
    generate = trainer._generate_single_turn
    trainer._generate_single_turn = lambda *a, **k: rollouts.append(1) or generate(*a, **k)

    def overflow(optimizer, args, kwargs):  # an update that overflows one weight (e.g. a low-precision optimizer)
        with torch.no_grad():
            weight[0, 0] = float("inf")

    handle = register_optimizer_step_post_hook(overflow)
    try:
        with pytest.raises(FloatingPointError, match=rf"{type(trainer).__name__}: the update of optimizer step 1 "
                                                     "made the weights non-finite .*before anything is generated"):
            trainer.train()
    finally:
        handle.remove()
    n_first = len(rollouts)
    assert n_first >= 1 and trainer.state.global_step == 0  # stopped in step 1, before step 2's rollout or a save


@pytest.mark.parametrize("method", list(TRAINERS))
def test_nonfinite_logits_stop_generation_before_sampling(tmp_path, method):
    trainer = _trainer(method, tmp_path)
    head = trainer.model.get_output_embeddings()

    def overflow(module, inputs, output):  # the logits overflow (as bf16 activations can), the weights are fine
        return output.index_fill(-1, torch.tensor([3]), float("inf"))

    handle = head.register_forward_hook(overflow)
    before = _weights(trainer)
    try:
        with pytest.raises(FloatingPointError, match=rf"{type(trainer).__name__}: non-finite logits while generating "
                                                     r"\(optimizer step 1; the weights are finite, so the activations "
                                                     r"overflowed in float32\); stopped before sampling"):
            trainer.train()
    finally:
        handle.remove()
    _assert_unchanged(trainer, before)
    # the guard's own hook is gone after the rollout: a plain forward does not raise
    trainer.model(torch.tensor([[1, 2, 3]]))
