"""A part of one's own, through the public API only: the example of docs/parts.md ("A part of your own"), executed
from the doc itself, adds its term as the doc says (by hand on a fixed batch) and changes training, given as an
instance or by its registered name; ``PartsTrainer`` subclassed with a plain GRPOConfig; the registry; ``Part.needs``
per class and read-only. Its 2-process == 1-process run: ``trainers_tests/distributed/test_custom_part.py``."""

import pickle
import re
import warnings

import pytest
import torch
from trl import GRPOConfig

import trl_variants
from trl_variants import ComposedConfig, ComposedTrainer, Part, PartsTrainer, accuracy_reward, register_part
from trl_variants.parts import part_class, registered_parts

from ..helpers import DEFAULT_MODEL_PATH, fixed_batch, loss_and_grads, small_config, train_dataset
from .doc_example import doc_example, doc_example_source

COEF = 0.5


@pytest.fixture(scope="module")
def SelfImitation():  # noqa: N802 (a class)
    return doc_example()["SelfImitation"]


def _composed(tmp_path, parts, **kw):
    return ComposedTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, train_dataset=train_dataset(16),
                           args=small_config(ComposedConfig, tmp_path, parts=parts, **kw))


def _hand_term(trainer, inputs) -> float:
    """COEF times the token mean of -log pi over the completions with a positive advantage, from a plain forward of
    the model (softmax of logits / temperature, as GRPO scores a completion)."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    P = inputs["prompt_ids"].size(1)
    with torch.no_grad():
        logits = trainer.model(input_ids=ids, attention_mask=attention).logits[:, P - 1:-1].float()
    logps = torch.log_softmax(logits / trainer.temperature, -1).gather(-1, inputs["completion_ids"][..., None])[..., 0]
    mask = inputs["completion_mask"] * (inputs["advantages"] > 0).unsqueeze(-1)
    return COEF * (-(logps * mask).sum() / mask.sum()).item()


def test_the_doc_example_uses_the_public_api_only():
    source = doc_example_source()
    imports = re.findall(r"^(?:from|import) .*$", source, re.M)
    assert imports == ["from trl_variants import Part, register_part"]
    assert "._" not in source.replace("self._", "")  # no private attribute of the trainer (or of anything else)
    assert len(source.strip().splitlines()) <= 20
    for name in ("Part", "PartsTrainer", "register_part", "LossTerm", "PolicyForward"):
        assert name in trl_variants.__all__


def test_its_term_is_the_hand_computation(tmp_path, SelfImitation):
    """On a fixed batch (advantages +1, -1, +1, -1): the loss is GRPO's (the trainer without the part) plus COEF times
    the token mean of -log pi over the two positive rows, computed by hand; its gradient is added; logged."""
    plain = _composed(tmp_path / "plain", [])
    custom = _composed(tmp_path / "custom", [SelfImitation(coef=COEF)])
    inputs, _ = fixed_batch(plain)
    assert (inputs["advantages"] > 0).sum() == 2
    loss_plain, grads_plain = loss_and_grads(plain, inputs)
    loss_custom, grads_custom = loss_and_grads(custom, inputs)
    term = _hand_term(custom, inputs)
    assert term > 1e-3  # the tiny model is peaked on the reference solutions: a small, not a zero, term
    assert loss_custom.item() - loss_plain.item() == pytest.approx(term, rel=1e-5, abs=1e-6)
    assert custom._metrics["train"]["loss/self_imitation"][-1] == pytest.approx(term, rel=1e-5, abs=1e-6)
    assert custom._metrics["train"]["self_imitation/better_fraction"][-1] == 0.5
    assert any(not torch.allclose(grads_custom[n], grads_plain[n]) for n in grads_plain)


def test_a_step_with_it_trains_other_weights(tmp_path, SelfImitation):
    """One training step each, same seed and data: without the part, with an instance, by its registered name (built
    by from_config: its default coef). The part changes the step; the instance and the name (same coef) agree."""
    kw = dict(max_steps=1, max_completion_length=16, learning_rate=1e-2)

    def weights_after(parts, name):
        trainer = _composed(tmp_path / name, parts, **kw)
        start = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        logged = {k: v for h in trainer.state.log_history for k, v in h.items()}
        return start, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}, logged

    start, plain, _ = weights_after([], "plain")
    _, by_instance, logged = weights_after([SelfImitation()], "instance")
    _, by_name, _ = weights_after(["self_imitation"], "name")
    assert logged["loss/self_imitation"] > 0 and "self_imitation/better_fraction" in logged
    moved = max((by_instance[n] - start[n]).abs().max().item() for n in start)
    differs = max((by_instance[n] - plain[n]).abs().max().item() for n in start)
    assert moved > 0 and differs > 1e-6
    assert all(torch.equal(by_instance[n], by_name[n]) for n in start)


def test_parts_trainer_subclass_takes_a_plain_grpo_config(tmp_path, SelfImitation):
    """No _config_class set: any GRPOConfig is accepted (before, "isinstance() arg 2 must be a type"); a wrong args
    type is refused naming the class expected."""

    class SelfImitationTrainer(PartsTrainer):
        def make_parts(self, args):
            return [SelfImitation(coef=COEF)]

    trainer = SelfImitationTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward,
                                   args=small_config(GRPOConfig, tmp_path), train_dataset=train_dataset(16))
    assert [p.name for p in trainer.parts] == ["self_imitation"]
    inputs, _ = fixed_batch(trainer)
    loss_and_grads(trainer, inputs)
    assert trainer._metrics["train"]["loss/self_imitation"][-1] == pytest.approx(_hand_term(trainer, inputs),
                                                                                 rel=1e-5, abs=1e-6)
    with pytest.raises(TypeError, match="args must be a GRPOConfig, got dict"):
        SelfImitationTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, args={},
                             train_dataset=train_dataset(16))

    class NotAPart(PartsTrainer):
        def make_parts(self, args):
            return ["self_imitation"]

    with pytest.raises(TypeError, match="make_parts returned 'self_imitation', not a trl_variants.Part instance"):
        NotAPart(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, args=small_config(GRPOConfig, tmp_path),
                 train_dataset=train_dataset(16))


def test_the_registry(SelfImitation):
    assert part_class("self_imitation") is SelfImitation
    assert registered_parts()[:5] == ["erpo_query_weights", "erpo_query_kl", "dph_rehearsal",
                                      "eepo_two_stage_rollout", "dapo_dynamic_sampling"]
    assert part_class("erpo_query_kl").__name__ == "QueryKL" and "self_imitation" in registered_parts()
    assert register_part(doc_example()["SelfImitation"]).name == "self_imitation"  # redefined: replaces itself

    class Clash(Part):
        name = "self_imitation"

    class Builtin(Part):
        name = "dph_rehearsal"

    class Unnamed(Part):
        pass

    with pytest.raises(ValueError, match="a part named 'self_imitation' is already registered"):
        register_part(Clash)
    with pytest.raises(ValueError, match="'dph_rehearsal' is the name of a built-in part"):
        register_part(Builtin)
    with pytest.raises(ValueError, match="has no name of its own"):
        register_part(Unnamed)
    with pytest.raises(TypeError, match="takes a subclass of trl_variants.Part"):
        register_part(object)
    with pytest.raises(ValueError, match="unknown part 'nope'"):
        part_class("nope")


def test_composed_config_takes_instances_classes_and_names(SelfImitation):
    common = dict(output_dir="x", use_cpu=True, bf16=False)
    instance = SelfImitation(coef=0.3)
    args = ComposedConfig(parts=["erpo_query_kl", instance], **common)
    assert args.parts == ["erpo_query_kl", instance] and args.part_names == ["erpo_query_kl", "self_imitation"]
    assert args.to_dict()["parts"] == ["erpo_query_kl", "self_imitation"]  # what logs and records keep
    assert pickle.loads(pickle.dumps(args)).parts == ["erpo_query_kl", "self_imitation"]
    assert "self_imitation" in str(args)

    class Counted(Part):
        name = "counted_part_of_a_test"

    assert ComposedConfig(parts=[Counted], **common).parts == ["counted_part_of_a_test"]  # a class: registered
    assert part_class("counted_part_of_a_test") is Counted
    with pytest.raises(ValueError, match="lists a part twice"):
        ComposedConfig(parts=["self_imitation", SelfImitation()], **common)
    with pytest.raises(TypeError, match="is not a part name, a trl_variants.Part subclass or instance"):
        ComposedConfig(parts=[3], **common)
    with pytest.raises(ValueError, match=r"unknown part\(s\) \['no_such_part'\]"):
        ComposedConfig(parts=["no_such_part"], **common)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        ComposedConfig(parts=[], **common)  # given: no warning


def test_needs_are_per_class_and_read_only():
    def provide(trainer, dataset, split):
        return dataset

    class Needs(Part):
        name = "needs_of_a_test"
        needs = {"column": provide}

    assert Part.needs == {} and dict(Needs.needs) == {"column": provide}
    with pytest.raises(TypeError):
        Part.needs["x"] = provide
    with pytest.raises(TypeError):
        Needs.needs["x"] = provide
    assert Part.needs == {} and part_class("erpo_query_kl").needs.keys() == {"ref_prompt_logp"}


# --- the trainer's side of the contract: unique state keys and term names, after_loss always called ---------------
class _Keeps(Part):
    def __init__(self, name):
        self.name, self.seen = name, []

    def state(self) -> dict:
        return {"position": 0}

    def after_loss(self, trainer, batch_losses) -> None:
        self.seen.append(sorted(batch_losses))


class _Term(_Keeps):
    def state(self) -> dict:
        return {}

    def loss(self, trainer, model, inputs, forward) -> dict:
        return {"extra": 0.0 * forward.completion_logps.sum()}


def test_two_parts_keeping_one_state_key_are_refused_at_construction(tmp_path):
    with pytest.raises(ValueError, match="the parts 'first' and 'second' both keep a state named 'position'"):
        _composed(tmp_path, [_Keeps("first"), _Keeps("second")])


def test_two_parts_returning_one_term_name_are_named_and_after_loss_sees_grpo_alone(tmp_path):
    only = _Keeps("only")
    trainer = _composed(tmp_path / "one", [only])
    inputs, _ = fixed_batch(trainer)
    loss_and_grads(trainer, inputs)
    assert only.seen == [["rollout"]]  # no part returned a term: after_loss still sees GRPO's loss
    clash = _composed(tmp_path / "two", [_Term("a"), _Term("b")])
    with pytest.raises(ValueError, match="the parts 'a' and 'b' both return a loss term named 'extra'"):
        loss_and_grads(clash, inputs)
