"""trl_variants/eepo/unlearning.py without a trainer: the unlearning step's gradient, summed over processes."""

from types import SimpleNamespace

import pytest
import torch

from trl_variants.eepo.unlearning import unlearning_gradient


def _stand_in(processes, reduce):
    return SimpleNamespace(is_fsdp_enabled=False, accelerator=SimpleNamespace(
        num_processes=processes, reduce=reduce, state=SimpleNamespace(fsdp_plugin=None)))


def _loss(model):
    return model(torch.arange(6.0).reshape(2, 3)).square().sum()


def test_one_process_takes_autograds_gradient_as_is():
    """No reduce (Accelerate's returns a copy even with one process: a second copy of every gradient, 12 GB for a
    3B-parameter policy); an unused parameter's gradient stays None."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    model[1].weight.requires_grad_(False)
    unused = torch.nn.Parameter(torch.ones(2))
    model.register_parameter("unused", unused)
    expected = torch.autograd.grad(_loss(model), [model[0].weight, model[0].bias, model[1].bias])
    params, grads = unlearning_gradient(_stand_in(1, lambda g, op: pytest.fail("reduced on one process")),
                                        model, _loss(model))
    by_param = dict(zip(map(id, params), grads, strict=True))
    assert len(params) == 4 and by_param[id(unused)] is None
    for p, e in zip([model[0].weight, model[0].bias, model[1].bias], expected, strict=True):
        assert torch.equal(by_param[id(p)], e)


def test_several_processes_sum_each_gradient_over_them():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    expected = torch.autograd.grad(_loss(model), list(model.parameters()))
    calls = []

    def reduce(g, op):  # two processes holding the same gradient
        calls.append(op)
        return g * 2

    _, grads = unlearning_gradient(_stand_in(2, reduce), model, _loss(model))
    assert calls == ["sum", "sum"]
    for g, e in zip(grads, expected, strict=True):
        assert torch.equal(g, 2 * e)
