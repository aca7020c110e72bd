"""A non-finite loss stops training with a message before the update (issue #16 item 2): transformers would log it
as 0 and the optimizer would turn every weight into NaN."""

import pytest
import torch

from trl_variants import (
    APOConfig,
    APOTrainer,
    DPHConfig,
    DPHTrainer,
    EEPOConfig,
    EEPOTrainer,
    ERPOConfig,
    ERPOTrainer,
    accuracy_reward,
)

from ..helpers import DEFAULT_MODEL_PATH, small_config, train_dataset

CASES = [(ERPOTrainer, ERPOConfig, {}), (EEPOTrainer, EEPOConfig, {"entropy_gate": "never"}),
         (DPHTrainer, DPHConfig, {"num_presamples": 2, "pef_threshold": 2}),
         (APOTrainer, APOConfig, {"num_generations": 1, "num_value_samples": 2})]


@pytest.mark.parametrize("trainer_cls,config_cls,extra", CASES, ids=[c[0].__name__ for c in CASES])
def test_nan_loss_stops_training_before_the_update(tmp_path, trainer_cls, config_cls, extra):
    args = small_config(config_cls, tmp_path, max_steps=1, presample_cache_dir=str(tmp_path / "c"), **extra) \
        if config_cls in (DPHConfig, APOConfig) else small_config(config_cls, tmp_path, max_steps=1, **extra)
    trainer = trainer_cls(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, args=args,
                          train_dataset=train_dataset(16))
    compute_loss = trainer._compute_loss  # the trainer's own loss, made non-finite (as an overflow would)
    trainer._compute_loss = lambda model, inputs: compute_loss(model, inputs) * float("nan")
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with pytest.raises(FloatingPointError, match=rf"{trainer_cls.__name__}: the loss is nan at optimizer step 1.*"
                                                 "lower learning_rate"):
        trainer.train()
    after = dict(trainer.model.named_parameters())
    for name, value in before.items():  # the optimizer never stepped: every weight is still finite and unchanged
        assert torch.equal(after[name].detach(), value), name
