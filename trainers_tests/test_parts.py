"""trl_variants/parts.py without a model: a part's state seen through the trainer (``PartAttribute``) and the part
lookup. The trainers that use them are tested in their packages (dph/, eepo/, composed/)."""

import pytest

from trl_variants.parts import Part, PartAttribute


class Counter(Part):
    name = "counter"

    def __init__(self):
        self.position = 0

    def state(self) -> dict:
        return {"position": self.position}


class Holder:  # what PartAttribute reads of a trainer: its ``parts``
    position = PartAttribute("counter", "position")

    def __init__(self, parts):
        self.parts = parts


def test_the_state_lives_in_the_part_and_the_trainer_reads_and_sets_it():
    part = Counter()
    trainer = Holder([part])
    trainer.position = 7
    assert part.position == 7 and part.state() == {"position": 7}  # what the checkpoint keeps: the part's
    part.position = 3
    assert trainer.position == 3 and "position" not in trainer.__dict__


def test_without_the_part_the_attribute_is_absent_until_set():
    trainer = Holder([])
    assert not hasattr(trainer, "position")
    with pytest.raises(AttributeError, match="no part 'counter', which holds 'position'"):
        trainer.position  # noqa: B018
    trainer.position = 5  # a plain attribute then, as on any object
    assert trainer.position == 5


@pytest.mark.parametrize(("zero_stage", "checkpointing", "kwargs", "refused"), [
    (3, True, {"use_reentrant": True}, True),    # TRL's kwargs for PEFT under ZeRO-3
    (3, True, {}, True),                         # kwargs without use_reentrant reach torch: reentrant
    (3, True, None, False),                      # no kwargs: transformers checkpoints non-reentrant
    (3, True, {"use_reentrant": False}, False),
    (3, False, {"use_reentrant": True}, False),  # no checkpointing
    (2, True, {"use_reentrant": True}, False),   # ZeRO-2 keeps whole weights
    (None, True, {"use_reentrant": True}, False),
])
def test_zero3_with_reentrant_checkpointing_is_read_from_the_deepspeed_plugin(zero_stage, checkpointing, kwargs,
                                                                                refused):
    """What the refusal below rests on, without DeepSpeed installed (CI): the ZeRO stage as accelerate's
    DeepSpeed plugin states it, and the checkpointing kwargs as TRL leaves them."""
    from types import SimpleNamespace

    from trl_variants._model import reentrant_checkpointing_under_zero3

    plugin = SimpleNamespace(zero_stage=zero_stage) if zero_stage else None
    trainer = SimpleNamespace(
        is_deepspeed_enabled=zero_stage is not None,
        accelerator=SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)),
        args=SimpleNamespace(gradient_checkpointing=checkpointing, gradient_checkpointing_kwargs=kwargs))
    assert reentrant_checkpointing_under_zero3(trainer) is refused


def _zero3_reentrant(monkeypatch):
    """ZeRO-3 as the trainers' check sees it (``_model._zero3``), with reentrant gradient checkpointing asked for as
    TRL asks for it under PEFT; the real 2-process run is scripts/check_distributed_backends.py --trainers dph_peft."""
    import trl_variants._model as model_module

    monkeypatch.setattr(model_module, "_zero3", lambda trainer: True)
    return dict(gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": True})


def test_a_second_forward_under_zero3_reentrant_checkpointing_is_refused_before_the_offline_pass(tmp_path,
                                                                                                   monkeypatch):
    """DPH-RL's D_pef forward under ZeRO-3 with reentrant checkpointing made DeepSpeed fail in the first backward (an
    AssertionError naming nothing of ours, after the offline pass): it is refused in __init__, naming the fixes."""
    import trl_variants.dph.part as dph_part

    from .helpers import small_trainer

    def no_pass(*args, **kwargs):
        raise AssertionError("the offline pass ran")

    monkeypatch.setattr(dph_part.Rehearsal, "setup", no_pass)
    with pytest.raises(ValueError, match=r"DPHTrainer: part 'dph_rehearsal' runs a forward with gradient of its own.*"
                                         r"ZeRO-3 with reentrant gradient checkpointing.*gradient_checkpointing=False.*"
                                         r"zero2\.yaml.*use_reentrant': False"):
        small_trainer("dph", tmp_path, **_zero3_reentrant(monkeypatch))


def test_a_loss_term_on_another_batch_is_refused_there_too(tmp_path, monkeypatch):
    """A part that did not set ``forwards_own_batch`` but returns a term on a batch of its own: refused when the
    term arrives, before the backward that would fail."""
    import torch

    from trl_variants.parts import LossTerm

    from .helpers import small_trainer

    trainer = small_trainer("erpo", tmp_path)  # no part with a batch of its own: accepted
    assert trainer._reentrant_zero3 is False
    trainer._reentrant_zero3 = True
    inputs = {"completion_ids": torch.zeros(2, 3, dtype=torch.long)}
    loss = torch.tensor(1.0, requires_grad=True)
    own = {"mine": LossTerm(torch.tensor(0.5), batch="own", rows=2)}
    trainer.model.eval()
    assert trainer.combine_loss(loss, dict(own), inputs) is not None  # evaluation: no backward, nothing refused
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # what the training loop sets
    assert trainer.combine_loss(loss, {"kl": LossTerm(torch.tensor(0.5))}, inputs) is not None  # rollout batch: fine
    with pytest.raises(ValueError, match=r"ERPOTrainer: loss term 'mine' \(batch 'own'\) runs a forward with gradient"):
        trainer.combine_loss(loss, own, inputs)


def test_dph_at_eta_zero_has_no_forward_of_its_own_and_is_not_refused(tmp_path, monkeypatch):
    """dph_coef = 0 never runs the D_pef forward: ZeRO-3 with reentrant checkpointing is accepted. (Only the
    decision sees ZeRO-3 here: the offline pass then runs as on one process, without deepspeed.)"""
    import trl_variants.parts as parts_module

    from .helpers import small_trainer

    monkeypatch.setattr(parts_module, "reentrant_checkpointing_under_zero3", lambda trainer: True)
    trainer = small_trainer("dph", tmp_path, dph_coef=0.0)
    assert trainer._reentrant_zero3 is True and not trainer.part("dph_rehearsal").forwards_own_batch
