"""A non-finite loss stops training with a message before the update: transformers would log it
as 0 and the optimizer would turn every weight into NaN."""

import pytest
import torch

from ..helpers import TRAINERS, small_trainer


@pytest.mark.parametrize("method", list(TRAINERS))
def test_nan_loss_stops_training_before_the_update(tmp_path, method):
    trainer = small_trainer(method, tmp_path, max_steps=1, **({"entropy_gate": "never"} if method == "eepo" else {}))
    compute_loss = trainer._compute_loss  # the trainer's own loss, made non-finite (as an overflow would)
    trainer._compute_loss = lambda model, inputs: compute_loss(model, inputs) * float("nan")
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with pytest.raises(FloatingPointError, match=rf"{type(trainer).__name__}: the loss is nan at optimizer step 1.*"
                                                 "lower learning_rate"):
        trainer.train()
    after = dict(trainer.model.named_parameters())
    for name, value in before.items():  # the optimizer never stepped: every weight is still finite and unchanged
        assert torch.equal(after[name].detach(), value), name
