"""`trl_variants._model`: the policy as the offline passes see it before training. Under DeepSpeed ZeRO-1/2 and FSDP
transformers' Trainer leaves the model on the CPU until ``prepare``, while the passes (run in ``__init__``) feed it
tensors on the accelerator's device: on a GPU they failed with "Expected all tensors to be on the same device"."""

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from trl_variants._model import on_accelerator_device

from .helpers import small_trainer

GPU = torch.device("cuda", 0)  # only named: the recording model below moves nowhere


class Recording(torch.nn.Linear):
    """A module on the CPU that records where ``.to`` sends it instead of going there."""

    def __init__(self):
        super().__init__(2, 2)
        self.moves = []

    def to(self, *args, **kwargs):
        self.moves.append(torch.device(args[0]))
        return self


def _trainer(device=GPU, deepspeed=True, zero_stage=2, model=None):
    plugin = SimpleNamespace(zero_stage=zero_stage) if deepspeed else None
    return SimpleNamespace(model=model or Recording(), is_deepspeed_enabled=deepspeed,
                           accelerator=SimpleNamespace(device=device, state=SimpleNamespace(deepspeed_plugin=plugin)))


@pytest.mark.parametrize("deepspeed", [True, False], ids=["zero2", "fsdp_or_ddp"])
def test_a_model_left_on_the_cpu_goes_to_the_accelerator_for_the_pass_and_back(deepspeed):
    trainer = _trainer(deepspeed=deepspeed)
    with on_accelerator_device(trainer):
        assert trainer.model.moves == [GPU]
    assert trainer.model.moves == [GPU, torch.device("cpu")]
    trainer = _trainer()
    with pytest.raises(RuntimeError), on_accelerator_device(trainer):
        raise RuntimeError("the pass failed")
    assert trainer.model.moves == [GPU, torch.device("cpu")]  # back where it was, also when the pass fails


def test_zero3_a_model_already_there_and_another_model_are_left_or_moved_as_they_should():
    zero3 = _trainer(zero_stage=3)  # partitioned at load, gathered by full_parameters: not moved
    with on_accelerator_device(zero3):
        pass
    assert zero3.model.moves == []
    there = _trainer(device=torch.device("cpu"))
    with on_accelerator_device(there):
        pass
    assert there.model.moves == []
    trainer, other = _trainer(), Recording()  # the pass's model, when it is not the trainer's
    with on_accelerator_device(trainer, other):
        pass
    assert other.moves == [GPU, torch.device("cpu")] and trainer.model.moves == []


@pytest.mark.parametrize("method", ["erpo", "apo"])
def test_the_offline_passes_run_on_the_accelerators_device(tmp_path, monkeypatch, method):
    """ERPO's reference pass and the presampling pass (A*-PO's stage 1; DPH-RL's shares it) run inside
    :func:`on_accelerator_device`, with the model they score."""
    entered = []

    @contextmanager
    def spy(trainer, model=None):
        entered.append(trainer.model if model is None else model)
        yield

    module = "trl_variants.erpo.part" if method == "erpo" else "trl_variants._offline"
    monkeypatch.setattr(f"{module}.on_accelerator_device", spy)
    trainer = small_trainer(method, tmp_path)
    assert entered == [trainer.model]


def _args(gc=True, reentrant=True):
    kwargs = {None: None, "unset": {}}.get(reentrant, {"use_reentrant": reentrant})
    return SimpleNamespace(gradient_checkpointing=gc, gradient_checkpointing_kwargs=kwargs)


@pytest.mark.parametrize("zero_stage,gc,reentrant,expected", [
    (3, True, True, True),  # what TRL sets for PEFT under ZeRO-3
    (3, True, "unset", True),  # kwargs without use_reentrant reach torch's checkpoint, whose default is reentrant
    (3, True, False, False), (3, True, None, False), (3, False, True, False), (2, True, True, False)])
def test_reentrant_checkpointing_under_zero3_only_where_all_three_hold(zero_stage, gc, reentrant, expected):
    from trl_variants._model import reentrant_checkpointing_under_zero3

    trainer = _trainer(zero_stage=zero_stage)
    trainer.args = _args(gc, reentrant)
    assert reentrant_checkpointing_under_zero3(trainer) is expected
    trainer.is_deepspeed_enabled = False  # DDP / FSDP: never
    assert reentrant_checkpointing_under_zero3(trainer) is False
