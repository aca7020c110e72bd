"""Checkpoint guarantees (docs/reliability.md, "Checkpoint guarantees"): every checkpoint of the four trainers
carries their identity, the config values a resume must keep and the algorithm state, inside ``trainer_state.json``;
an interrupted save always leaves a resumable last checkpoint; a checkpoint of another trainer or config is refused
by name."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import warnings
from pathlib import Path

import pytest
import torch
import transformers.trainer
from transformers import TrainerState

from trl_variants import EEPOConfig, EEPOTrainer, accuracy_reward
from trl_variants._checkpoint import TrlVariantsCheckpoint, check_checkpoint_record
from trl_variants.registry import method_classes

from ..helpers import DEFAULT_MODEL_PATH, run_two_ranks, small_config, train_dataset

RECORD = TrlVariantsCheckpoint.__name__
SAVE = dict(save_strategy="steps", save_steps=1, per_device_train_batch_size=4, max_completion_length=8)


class Crash(BaseException):
    """The process dies here (a BaseException, like the KeyboardInterrupt or SystemExit of a real interruption:
    nothing on the way catches it)."""


def text_reward(completions, **kwargs):
    """Deterministic in the text and not constant over a group: the policy really moves at every step, so an
    inexact resume shows in the weights."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(sum(map(ord, t)) % 5) / 4 for t in texts]


def checkpoint_dirs(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-"))


def record(checkpoint: Path) -> dict:
    return TrainerState.load_from_json(str(checkpoint / "trainer_state.json")).stateful_callbacks[RECORD]


# ------------------------------------------------------------------------------------ (a) interrupted saves ---
def _eepo(out: Path, **kw):
    # 16 tokens at temperature 1.5: the completions of a group differ (the tiny model is very peaked), so the
    # advantages and the updates are not zero
    args = dict(SAVE, output_dir=str(out), max_steps=3, save_total_limit=1, entropy_gate="always",
                temperature=1.5, max_completion_length=16, **kw)
    return EEPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=text_reward,
                       args=small_config(EEPOConfig, out, **args), train_dataset=train_dataset())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    trainer = _eepo(tmp_path_factory.mktemp("uninterrupted"))
    start = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    assert any(not torch.equal(params[n], start[n]) for n in params)  # training really moved the weights
    return params, list(trainer._entropy_history)


def _die_at_second_save(monkeypatch, where: str) -> None:
    """Interrupt the save of checkpoint-2: after the model, optimizer and RNG files, before or while transformers
    writes ``trainer_state.json`` (which holds our record), or after it, before the rotation of old checkpoints."""
    calls = {"save_to_json": 0, "rotate": 0}
    # the rotation is transformers.trainer.rotate_checkpoints, Trainer._rotate_checkpoints in older 5.x (5.0)
    owner, name = ((transformers.trainer, "rotate_checkpoints") if hasattr(transformers.trainer, "rotate_checkpoints")
                   else (transformers.Trainer, "_rotate_checkpoints"))
    real_save, real_rotate = TrainerState.save_to_json, getattr(owner, name)

    def save_to_json(self, json_path):
        calls["save_to_json"] += 1
        if calls["save_to_json"] < 2 or where == "before_rotation":
            return real_save(self, json_path)
        text = json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"
        if where != "before_trainer_state":
            with open(json_path, "w") as f:
                f.write(text[: len(text) // 2] if where == "truncated_trainer_state" else "")
        raise Crash

    def rotate(*args, **kwargs):
        calls["rotate"] += 1
        if calls["rotate"] >= 2:
            raise Crash
        return real_rotate(*args, **kwargs)

    monkeypatch.setattr(TrainerState, "save_to_json", save_to_json)
    monkeypatch.setattr(owner, name, rotate)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["before_trainer_state", "empty_trainer_state", "truncated_trainer_state",
                                   "before_rotation"])
def test_interrupted_save_leaves_a_resumable_last_checkpoint(tmp_path, monkeypatch, uninterrupted, where):
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        _die_at_second_save(m, where)
        with pytest.raises(Crash):
            _eepo(out).train()
    assert checkpoint_dirs(out) == ["checkpoint-1", "checkpoint-2"]  # save_total_limit=1, but rotation never ran
    complete = where == "before_rotation"
    # with restore_callback_states_from_checkpoint=True transformers re-creates our callback: it must keep working
    resumed = _eepo(out, restore_callback_states_from_checkpoint=complete)
    if complete:
        resumed.train(resume_from_checkpoint=True)
    else:
        with pytest.raises(ValueError, match=r"checkpoint-2/trainer_state\.json is (missing|unreadable).*"
                                             r"resume_from_checkpoint=True to pick the last complete one"):
            resumed.train(resume_from_checkpoint=str(out / "checkpoint-2"))
        with pytest.warns(UserWarning, match=r"checkpoint-2 is incomplete.*Resuming from .*checkpoint-1"):
            resumed.train(resume_from_checkpoint=True)
        assert (out / "_incomplete-checkpoint-2").is_dir()  # moved aside: no rotation or upload counts it
    assert resumed.state.global_step == 3
    params, history = uninterrupted
    for name, p in resumed.model.named_parameters():
        assert torch.equal(p, params[name]), name  # exactly the uninterrupted run
    assert list(resumed._entropy_history) == history
    assert checkpoint_dirs(out) == ["checkpoint-3"]
    last = record(out / "checkpoint-3")
    assert last["trainer"] == "EEPOTrainer" and last["algorithm_state"] == {"entropy_history": history}


# ----------------------------------------------------------------- (d) every trainer's checkpoint, identity ---
def _trainer(name: str, out: Path, reward_funcs=accuracy_reward, **kw):
    args, rows = dict(SAVE, output_dir=str(out), max_steps=1), 32
    if name == "dph":
        args.update(num_presamples=4, pef_threshold=4, max_completion_length=40, presample_cache_dir=str(out / "c"))
        rows = 24
    if name == "apo":
        args.update(num_generations=1, num_value_samples=2, presample_cache_dir=str(out / "c"))
        rows = 8
    args.update(kw)
    trainer_cls, config_cls = method_classes(name)
    return trainer_cls(model=DEFAULT_MODEL_PATH, reward_funcs=reward_funcs,
                       args=small_config(config_cls, out, **args), train_dataset=train_dataset(rows))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """checkpoint-1 of a one-step run of every trainer, and of plain GRPOTrainer."""
    found = {}
    for name in ("erpo", "eepo", "dph", "apo", "grpo"):
        out = tmp_path_factory.mktemp(name)
        _trainer(name, out).train()
        found[name] = out / "checkpoint-1"
    return found


OWN_FIELD = {"erpo": ("query_kl_coef", 0.01), "eepo": ("entropy_window", 3), "dph": ("dph_coef", 0.2),
             "apo": ("value_beta", 0.5)}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["erpo", "eepo", "dph", "apo"])
def test_every_checkpoint_carries_its_trainer_config_and_state(checkpoints, name):
    rec = record(checkpoints[name])
    assert rec["trainer"] == {"erpo": "ERPOTrainer", "eepo": "EEPOTrainer", "dph": "DPHTrainer",
                              "apo": "APOTrainer"}[name]
    config = rec["config"]
    assert config["learning_rate"] == 1e-3 and config["seed"] == 0 and config["per_device_train_batch_size"] == 4
    assert config["num_generations"] == (1 if name == "apo" else 4) and config["world_size"] == 1
    field, value = OWN_FIELD[name]
    assert config[field] == value
    assert "presample_cache_dir" not in config  # where a cache lives does not change the result
    state = rec["algorithm_state"]
    if name == "eepo":
        assert len(state["entropy_history"]) == 1
    elif name == "dph":
        assert (state["pef_epoch"], state["pef_pos"]) != (0, 0)  # one micro-step of the D_pef stream
    else:
        assert state == {}
    assert not (checkpoints[name] / "trl_variants_state.json").exists()  # no side file: all in trainer_state.json


# ----------------------------------------------------------------------- (b, c) refused by name, with the fix ---
@pytest.mark.slow
@pytest.mark.parametrize(("resumer", "writer"), [("erpo", "dph"), ("apo", "eepo")])
def test_checkpoint_of_another_trainer_is_refused_by_name(tmp_path, checkpoints, resumer, writer):
    written_by = record(checkpoints[writer])["trainer"]
    with pytest.raises(ValueError) as err:
        _trainer(resumer, tmp_path).train(resume_from_checkpoint=str(checkpoints[writer]))
    assert str(err.value) == (f"checkpoint {checkpoints[writer]} was written by {written_by}; resume it with "
                              f"{written_by}, or start a new run without resume_from_checkpoint")


@pytest.mark.slow
@pytest.mark.parametrize(("name", "field", "old", "new"), [("erpo", "learning_rate", 1e-3, 2e-3),
                                                           ("eepo", "entropy_window", 3, 4),
                                                           ("eepo", "seed", 0, 1)])
def test_changed_config_is_refused_naming_field_values_and_fix(tmp_path, checkpoints, name, field, old, new):
    with pytest.raises(ValueError) as err:
        _trainer(name, tmp_path, **{field: new}).train(resume_from_checkpoint=str(checkpoints[name]))
    message = str(err.value)
    assert f"({field}: checkpoint {old!r}, this run {new!r})" in message
    assert f"set {field} back to the checkpoint's value" in message
    assert "start a new run without resume_from_checkpoint" in message


@pytest.mark.slow
def test_a_field_that_changes_nothing_in_both_runs_is_not_compared(tmp_path, checkpoints):
    """A checkpoint written with Query-KL off and ``query_kl_estimator='k1'`` (accepted before ERPOConfig refused an
    option that changes nothing) resumes with Query-KL off and the estimator dropped; where the estimator acts in
    the checkpoint, the difference is refused by name."""
    from trl_variants import ERPOConfig
    from trl_variants._checkpoint import check_checkpoint_record

    copy = tmp_path / "checkpoint-1"
    shutil.copytree(checkpoints["erpo"], copy)
    state_file = copy / "trainer_state.json"
    state = json.loads(state_file.read_text())
    config = state["stateful_callbacks"][RECORD]["config"]
    config.update(query_kl_coef=0.0, query_kl_estimator="k1")
    state_file.write_text(json.dumps(state))
    args = small_config(ERPOConfig, tmp_path, **dict(SAVE, output_dir=str(tmp_path), max_steps=1, query_kl_coef=0.0))
    check_checkpoint_record(str(copy), "ERPOTrainer", args)  # the estimator is inert in both: not compared
    config.update(query_kl_coef=0.01)
    state_file.write_text(json.dumps(state))
    with pytest.raises(ValueError, match=r"query_kl_coef: checkpoint 0\.01, this run 0\.0; query_kl_estimator: "
                                         r"checkpoint 'k1', this run 'k3'"):
        check_checkpoint_record(str(copy), "ERPOTrainer", args)


@pytest.mark.slow
def test_checkpoint_without_record_is_refused_naming_the_file(tmp_path, checkpoints):
    # plain GRPOTrainer
    with pytest.raises(ValueError, match=r"checkpoint-1/trainer_state\.json has no trl_variants record.*not "
                                         r"written by EEPOTrainer") as err:
        _trainer("eepo", tmp_path / "a").train(resume_from_checkpoint=str(checkpoints["grpo"]))
    assert "Start a new run without resume_from_checkpoint" in str(err.value)
    # an older trl_variants: state in trl_variants_state.json beside a trainer_state.json without the record
    old = tmp_path / "old" / "checkpoint-1"
    shutil.copytree(checkpoints["eepo"], old)
    state = json.loads((old / "trainer_state.json").read_text())
    del state["stateful_callbacks"][RECORD]
    (old / "trainer_state.json").write_text(json.dumps(state))
    (old / "trl_variants_state.json").write_text(json.dumps({"entropy_history": [0.1]}))
    with pytest.raises(ValueError, match=r"trainer_state\.json has no trl_variants record.*trl_variants_state\.json"):
        _trainer("eepo", tmp_path / "b").train(resume_from_checkpoint=str(old))
    # nothing complete to resume: named, not a JSONDecodeError
    (tmp_path / "c" / "checkpoint-1").mkdir(parents=True)
    (tmp_path / "c" / "checkpoint-1" / "trainer_state.json").write_text("")
    with pytest.raises(ValueError, match=r"no complete checkpoint in .*trainer_state\.json is unreadable"):
        _trainer("eepo", tmp_path / "c").train(resume_from_checkpoint=True)


# --------------------------------------------------------------------- the global D_pef stream, two gloo ranks ---
TWO_RANKS = """
import torch
torch.set_num_threads(1)
from accelerate.utils import gather_object
from transformers import TrainerState
from trl_variants import DPHConfig, DPHTrainer, accuracy_reward, load_default_dataset
from trl_variants.default import DEFAULT_MODEL_PATH


def dph(max_steps):
    args = DPHConfig(output_dir={out!r}, use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none",
                     disable_tqdm=True, save_strategy="steps", save_steps=1, per_device_train_batch_size=4,
                     num_generations=4, max_completion_length=40, learning_rate=1e-3, seed=0, max_steps=max_steps,
                     num_presamples=4, pef_threshold=4, pef_batch_size=3, presample_cache_dir={cache!r})
    return DPHTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, args=args,
                      train_dataset=load_default_dataset(24, 4)["train"])


t = dph(3)
t.train()
at_3 = gather_object([t._extra_state()])
assert at_3[0] == at_3[1] and at_3[0] != {{"pef_epoch": 0, "pef_pos": 0}}, at_3  # one global stream position
stored = TrainerState.load_from_json({out!r} + "/checkpoint-3/trainer_state.json")
assert stored.stateful_callbacks["TrlVariantsCheckpoint"]["algorithm_state"] == at_3[0]
resumed = dph(3)
resumed.train(resume_from_checkpoint={out!r} + "/checkpoint-2")
assert gather_object([resumed._extra_state()]) == at_3  # both ranks continued the stream from the checkpoint
print("OK", at_3)
"""


@pytest.mark.slow
def test_two_processes_resume_the_global_pef_stream(tmp_path):
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS.format(out=str(tmp_path / "out"), cache=str(tmp_path / "cache")))
    run_two_ranks(script, 29563, timeout=400)


# ------------------------------------------------------------------- the data order after an epoch boundary ---
def test_an_optimizer_state_mapped_to_cpu_0_loads_under_transformers_up_to_5_17(tmp_path, monkeypatch):
    """transformers up to 5.17 (what the [vllm] extra installs) loads the optimizer state of a run on several CPU
    processes with ``map_location=args.device``, ``cpu:0``, which torch refuses: no such run could resume (the
    two-process resume tests above failed there). A resume registers a deserializer that keeps those storages on the
    CPU; nothing is registered under transformers 5.18 and later, which map to "cpu" themselves."""
    from trl_variants import _checkpoint

    path = tmp_path / "optimizer.pt"
    torch.save({"state": {0: {"exp_avg": torch.arange(3.0)}}}, path)
    # this process as if no resume had registered it yet (the registry is put back after the test)
    registry = [entry for entry in torch.serialization._package_registry if entry[2] is not _checkpoint._keep_on_the_cpu]
    monkeypatch.setattr(torch.serialization, "_package_registry", registry)
    monkeypatch.setattr(_checkpoint, "_INDEXED_CPU_REGISTERED", False)
    # the module object code imports now (importing TRL's grpo_trainer replaces sys.modules["transformers"])
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "5.18.0")
    _checkpoint.restore_indexed_cpu_locations()
    assert not _checkpoint._INDEXED_CPU_REGISTERED
    with pytest.raises(RuntimeError, match="tagged with cpu:0"):  # what 5.17 met
        torch.load(path, map_location=torch.device("cpu", 0), weights_only=True)
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "5.17.0")
    _checkpoint.restore_indexed_cpu_locations()
    loaded = torch.load(path, map_location=torch.device("cpu", 0), weights_only=True)
    assert torch.equal(loaded["state"][0]["exp_avg"], torch.arange(3.0))
    assert loaded["state"][0]["exp_avg"].device == torch.device("cpu")


def test_replayable_epochs_keep_trls_order_and_replay_any_epoch():
    """TRL's RepeatSampler draws one permutation per pass from a generator seeded once: a new sampler (a resumed run)
    started again at epoch 0's order. ReplayableEpochs gives every epoch TRL's order, from a fresh sampler too."""
    from trl.trainer.utils import RepeatSampler

    from trl_variants._checkpoint import ReplayableEpochs

    def sampler():
        return RepeatSampler(list(range(10)), mini_repeat_count=2, batch_size=2, repeat_count=1, shuffle=True, seed=7)

    trl = sampler()
    epochs = [list(trl) for _ in range(4)]  # what an uninterrupted run trains on
    assert len({tuple(e) for e in epochs}) == 4
    replay = ReplayableEpochs(sampler())
    assert [(replay.set_epoch(k), list(replay))[1] for k in range(4)] == epochs  # set_epoch at each epoch: TRL's
    fresh = ReplayableEpochs(sampler())
    fresh.set_epoch(2)  # a run resumed in epoch 2
    assert list(fresh) == epochs[2] and list(sampler()) == epochs[0] != epochs[2]  # TRL's fresh sampler: epoch 0's
    ahead = ReplayableEpochs(sampler())
    assert [list(ahead) for _ in range(4)] == epochs  # iterated without set_epoch (A*-PO's look-ahead): as TRL's
    assert len(replay) == len(trl)
    unseeded = RepeatSampler(list(range(10)), mini_repeat_count=2, batch_size=2, seed=None)  # torch's fixed default
    second = [list(unseeded) for _ in range(2)][1]
    again = ReplayableEpochs(RepeatSampler(list(range(10)), mini_repeat_count=2, batch_size=2, seed=None))
    again.set_epoch(1)
    assert list(again) == second


def test_on_epoch_begin_sets_the_epoch_where_accelerates_set_epoch_does_not_reach():
    """Process 0 of 2, resumed inside epoch 1: the prepared dataloader skips its first batch (SkipBatchSampler >
    BatchSamplerShard > BatchSampler > sampler), and Accelerate's set_epoch stops short of the sampler. The callback
    sets it (transformers' ``state.epoch`` is the checkpoint's, 1.5), so the batches are the uninterrupted run's."""
    from types import SimpleNamespace

    from accelerate.data_loader import prepare_data_loader, skip_first_batches
    from trl.trainer.utils import RepeatSampler

    from trl_variants._checkpoint import ReplayableEpochs

    def loader():
        sampler = ReplayableEpochs(RepeatSampler(list(range(8)), mini_repeat_count=2, batch_size=2, seed=0))
        data = torch.utils.data.DataLoader(list(range(8)), batch_size=2, sampler=sampler)
        return sampler, prepare_data_loader(data, num_processes=2, process_index=0, put_on_device=False, rng_types=[])

    _, whole = loader()
    epochs = []
    for epoch in range(2):  # as transformers runs them: set_epoch, then iterate
        whole.set_epoch(epoch)
        epochs.append([b.tolist() for b in whole])
    assert epochs[0] != epochs[1]
    sampler, resumed = loader()
    skipping = skip_first_batches(resumed, 1)
    skipping.set_epoch(1)
    assert [b.tolist() for b in skipping] == epochs[0][1:]  # Accelerate alone: epoch 0's order (the bug)
    TrlVariantsCheckpoint(SimpleNamespace(_train_sampler=sampler)).on_epoch_begin(None, TrainerState(epoch=1.5), None)
    skipping.set_epoch(1)
    assert [b.tolist() for b in skipping] == epochs[1][1:]


@pytest.mark.parametrize("checkpoint", [2, 3], ids=["at-the-epoch-boundary", "inside-the-second-epoch"])
def test_resume_after_the_first_epoch_trains_the_uninterrupted_run(tmp_path, checkpoint):
    """4 prompts, 2 a step: an epoch is 2 steps. Resumed at step 2 (epoch 1 begins) or 3 (inside it), the run took
    epoch 0's prompt order again (and from step 3 skipped the first batch of that order): other prompts than the
    uninterrupted run, other weights. Now the same weights, bit for bit, and the same logged numbers."""
    def erpo(out, max_steps):
        trainer_cls, config_cls = method_classes("erpo")
        args = small_config(config_cls, out, **dict(SAVE, num_generations=2, max_steps=max_steps))
        return trainer_cls(model=DEFAULT_MODEL_PATH, reward_funcs=text_reward, args=args,
                           train_dataset=train_dataset(4))

    whole = erpo(tmp_path / "whole", 5)
    whole.train()
    resumed = erpo(tmp_path / "resumed", 5)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / f"checkpoint-{checkpoint}"))
    assert resumed.state.global_step == 5 and whole.state.epoch == 2.5
    for (name, a), b in zip(whole.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b), name
    def steps(trainer):  # the checkpoint's log history comes back with it: every step is compared (the offline pass
        # runs again in the resumed run and adds its numbers to its first log)
        return [{k: v for k, v in h.items() if k != "step_time" and not k.startswith("offline_pass/")}
                for h in trainer.state.log_history if "loss" in h]

    assert len(steps(resumed)) == 5 and steps(resumed) == steps(whole)


TWO_RANKS_EPOCHS = """
import torch
torch.set_num_threads(1)
from trl_variants import ERPOConfig, ERPOTrainer, load_default_dataset
from trl_variants.default import DEFAULT_MODEL_PATH


def text_reward(completions, **kwargs):  # test_checkpoints.text_reward: the policy moves at every step
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(sum(map(ord, t)) % 5) / 4 for t in texts]


def erpo(out):
    args = ERPOConfig(output_dir=out, use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none",
                      disable_tqdm=True, save_strategy="steps", save_steps=1, per_device_train_batch_size=2,
                      num_generations=2, max_completion_length=8, learning_rate=1e-3, seed=0, max_steps=4,
                      steps_per_generation={steps_per_generation})
    return ERPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=text_reward, args=args,
                       train_dataset=load_default_dataset(4, 4)["train"])


whole = erpo({out!r} + "/whole")
whole.train()
resumed = erpo({out!r} + "/resumed")
resumed.train(resume_from_checkpoint={out!r} + "/whole/checkpoint-3")  # inside epoch 1 (an epoch is 2 steps)
# with steps_per_generation=2 also inside a rollout: each process restores its own (rollout_0.pt, rollout_1.pt)
import os
assert os.path.exists({out!r} + f"/whole/checkpoint-3/rollout_{{whole.args.process_index}}.pt") == (
    {steps_per_generation} == 2)
for (name, a), b in zip(whole.model.named_parameters(), resumed.model.parameters(), strict=True):
    assert torch.equal(a, b), name
if {steps_per_generation} == 2:  # one process's file lost: both generate again (one alone would wait forever)
    import shutil, warnings
    partial = {out!r} + "/partial/checkpoint-3"
    if whole.args.process_index == 0:
        shutil.copytree({out!r} + "/whole/checkpoint-3", partial)
        os.remove(partial + "/rollout_1.pt")
    whole.accelerator.wait_for_everyone()
    regenerated = erpo({out!r} + "/regenerated")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        regenerated.train(resume_from_checkpoint=partial)
    assert regenerated.state.global_step == 4
    assert any("inside a rollout" in str(w.message) for w in said) == (whole.args.process_index == 0)
    assert any(not torch.equal(a, b) for a, b in zip(whole.model.parameters(), regenerated.model.parameters()))
print("OK")
"""


@pytest.mark.slow
@pytest.mark.parametrize("steps_per_generation", [1, 2], ids=["between-rollouts", "inside-a-rollout"])
def test_two_processes_resume_inside_the_second_epoch(tmp_path, steps_per_generation):
    """On several processes a mid-epoch resume wraps the sampler four deep (SkipBatchSampler > BatchSamplerShard >
    BatchSampler), where Accelerate's set_epoch does not reach it: the epoch is set from on_epoch_begin. With
    steps_per_generation=2 one rollout is an epoch (4 prompts), and checkpoint-3 is inside both: each process brings
    back the micro-batches of its own rollout."""
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS_EPOCHS.format(out=str(tmp_path), steps_per_generation=steps_per_generation))
    run_two_ranks(script, 29567 + steps_per_generation, timeout=400)


def _logged_steps(trainer) -> list[dict]:
    """Every step's logged numbers (the checkpoint's log history comes back with it; the offline pass runs again in a
    resumed run and adds its numbers to its first log, and step_time is a wall-clock time)."""
    return [{k: v for k, v in h.items() if k != "step_time" and not k.startswith("offline_pass/")}
            for h in trainer.state.log_history if "loss" in h]


def _assert_same_run(whole, resumed) -> None:
    assert resumed.state.global_step == whole.state.global_step
    for (name, a), b in zip(whole.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert _logged_steps(resumed) == _logged_steps(whole)


def test_a_checkpoint_inside_a_rollout_resumes_exactly_and_one_without_its_rollout_is_said(tmp_path):
    """GRPOTrainer trains a rollout's micro-batches from memory: with steps_per_generation=2 two optimizer steps share
    one rollout, and a run resumed after step 3 generated steps 3-4's rollout again (other completions, other weights).
    Each process's rollout is now in the checkpoint (rollout_<i>.pt, only where a rollout is unfinished): resumed
    there, the same weights bit for bit and the same logged numbers. Without that file (a checkpoint of an earlier
    version) the resume is said, and it ends elsewhere (which shows that this test sees the difference)."""
    def erpo(out):
        trainer_cls, config_cls = method_classes("erpo")
        args = small_config(config_cls, out, **dict(SAVE, num_generations=2, max_steps=4, steps_per_generation=2))
        return trainer_cls(model=DEFAULT_MODEL_PATH, reward_funcs=text_reward, args=args,
                           train_dataset=train_dataset(16))

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # save_steps=1 is not warned about any more
        whole = erpo(tmp_path / "whole")
    whole.train()
    saved = {n: (tmp_path / "whole" / f"checkpoint-{n}" / "rollout_0.pt").exists() for n in (1, 2, 3, 4)}
    assert saved == {1: True, 2: False, 3: True, 4: False}
    for n in (2, 3):
        resumed = erpo(tmp_path / f"resumed-{n}")
        resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / f"checkpoint-{n}"))
        _assert_same_run(whole, resumed)
    old = tmp_path / "old" / "checkpoint-3"
    shutil.copytree(tmp_path / "whole" / "checkpoint-3", old)
    (old / "rollout_0.pt").unlink()
    regenerated = erpo(tmp_path / "regenerated")
    with pytest.warns(UserWarning, match=r"checkpoint-3 was saved after step 3, inside a rollout .*holds no "
                                         r"rollout_0\.pt.*steps up to 4 .*checkpoint-2"):
        regenerated.train(resume_from_checkpoint=str(old))
    assert any(not torch.equal(a, b) for a, b in zip(whole.model.parameters(), regenerated.model.parameters(), strict=True))
    # a rollout file of another step (left in the folder by another run) is not used, and said
    stale = tmp_path / "stale" / "checkpoint-1"
    shutil.copytree(tmp_path / "whole" / "checkpoint-1", stale)
    shutil.copy(tmp_path / "whole" / "checkpoint-3" / "rollout_0.pt", stale / "rollout_0.pt")
    with pytest.warns(UserWarning, match=r"rollout_0\.pt was saved after step 3, but .*checkpoint-1 after step 1.*"
                                         r"not used"):
        erpo(tmp_path / "from-stale").train(resume_from_checkpoint=str(stale))
    # the same trainer resumed after a run of its own: that run's rollout in memory is not trained on
    uninterrupted = [p.detach().clone() for p in whole.model.parameters()]
    whole.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-2"))
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted, whole.model.parameters(), strict=True))


def test_a_save_called_off_after_the_step_leaves_no_checkpoint_folder(tmp_path):
    """The rollout is written where transformers writes the checkpoint (beside its RNG state), not when a save is
    first asked for: a callback that calls a save off after ours (or save_strategy="best" without a new best) left
    folders holding only rollout_0.pt, which resume_from_checkpoint=True took for interrupted saves and which counted
    against save_total_limit."""
    from transformers import TrainerCallback

    class NoSaveOnOddSteps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % 2:
                control.should_save = False

    trainer_cls, config_cls = method_classes("erpo")
    args = small_config(config_cls, tmp_path, **dict(SAVE, num_generations=2, max_steps=4, steps_per_generation=2))
    trainer = trainer_cls(model=DEFAULT_MODEL_PATH, reward_funcs=text_reward, args=args,
                          train_dataset=train_dataset(16), callbacks=None)
    trainer.add_callback(NoSaveOnOddSteps())  # after the trainer's own callbacks
    trainer.train()
    assert checkpoint_dirs(tmp_path) == ["checkpoint-2", "checkpoint-4"]


ROLLOUT_CASES = {"eepo": dict(entropy_gate="always", temperature=1.5), "dph": dict(pef_threshold=1), "apo": {},
                 "composed": {}, "composed-dapo": dict(parts=["erpo_query_weights", "dapo_dynamic_sampling"]),
                 "erpo-num_iterations-2": dict(num_iterations=2)}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(ROLLOUT_CASES))
def test_every_trainer_resumes_inside_a_rollout_exactly(tmp_path, case):
    """What each trainer adds to a rollout (EEPO's two stages and gate, DPH-RL's reference log-probs, A*-PO's
    values, the composed trainer's parts, DAPO's refills) is in the micro-batches GRPOTrainer buffers, so it comes
    back with them; with num_iterations=2 a rollout is trained twice (4 steps), checkpoint-3 in its second pass."""
    name = case.split("-")[0]
    kw = dict(max_steps=4, steps_per_generation=2, reward_funcs=text_reward, **ROLLOUT_CASES[case])
    whole = _trainer(name, tmp_path / "whole", **kw)
    whole.train()
    assert (tmp_path / "whole" / "checkpoint-3" / "rollout_0.pt").exists()
    resumed = _trainer(name, tmp_path / "resumed", **kw)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-3"))
    _assert_same_run(whole, resumed)


# ------------------------------------------------------------------------- resumed on another number of processes ---
def _record_on(checkpoint: Path, copy: Path, **config) -> Path:
    """A copy of ``checkpoint`` whose record says it was written with ``config`` (e.g. on 2 processes)."""
    shutil.copytree(checkpoint, copy)
    state = json.loads((copy / "trainer_state.json").read_text())
    state["stateful_callbacks"][RECORD]["config"].update(config)
    (copy / "trainer_state.json").write_text(json.dumps(state))
    return copy


def test_another_number_of_processes_resumes_when_the_global_batch_is_kept(tmp_path, checkpoints, monkeypatch):
    """A job restarted on fewer or more GPUs: the checkpoint of 2 processes x 2 rows resumes on 1 process x 4 rows
    (the same 4 completions per optimizer step and per rollout), said; another global batch is refused before the
    model loads, naming both; under DeepSpeed, which loads its partitioned optimizer state only on the same number
    of processes, it is refused too."""
    two = _record_on(checkpoints["erpo"], tmp_path / "two" / "checkpoint-1", world_size=2, per_device_train_batch_size=2)
    trainer = _trainer("erpo", tmp_path / "resumed", max_steps=2)
    with pytest.warns(UserWarning, match=r"checkpoint-1 was written on 2 process\(es\) and this run has 1\. The global "
                                         r"batch is the same \(4 completions per optimizer step, 4 per rollout\).*not "
                                         r"bit for bit"):
        trainer.train(resume_from_checkpoint=str(two))
    assert trainer.state.global_step == 2
    other = _record_on(checkpoints["erpo"], tmp_path / "other" / "checkpoint-1", world_size=2,
                       per_device_train_batch_size=4)
    with pytest.raises(ValueError, match=r"written on 2 process\(es\), this run has 1: .*the checkpoint's is 8 "
                                         r"completions per optimizer step and 8 per rollout.*this run's 4 and 4\. Set "
                                         r"gradient_accumulation_steps and steps_per_generation"):
        _trainer("erpo", tmp_path / "refused", max_steps=2, resume_from_checkpoint=str(other))
    args = _erpo_args(tmp_path / "deepspeed")
    as_zero2(two)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # as accelerate launch sets it (read by the check alone)
    with pytest.raises(ValueError, match=r"written on 2 process\(es\), this run has 1, under DeepSpeed: .*Resume on 2 "
                                         r"process\(es\).*DDP or FSDP2"):
        check_checkpoint_record(str(two), "ERPOTrainer", args)


def _erpo_args(out: Path):
    """The config ``_trainer("erpo", out, max_steps=2)`` builds, with its devices set up (``world_size``) before a test
    sets a launcher's variables: a config built under ``ACCELERATE_USE_DEEPSPEED`` / ``ACCELERATE_USE_FSDP`` would set
    up DeepSpeed or FSDP state that outlives the test in its worker. The checks read those variables themselves."""
    args = small_config(method_classes("erpo")[1], out, **dict(SAVE, output_dir=str(out), max_steps=2))
    assert args.world_size == 1
    return args


def as_zero2(checkpoint: Path, zero3: bool = False) -> Path:
    """``checkpoint``'s optimizer state laid out as DeepSpeed writes it (file names as a 2-process ZeRO-2 / ZeRO-3 run
    of ``scripts/check_distributed_backends.py`` wrote them): ``global_step<N>/`` and ``latest``, no ``optimizer.pt``."""
    step = f"global_step{json.loads((checkpoint / 'trainer_state.json').read_text())['global_step']}"
    (checkpoint / step).mkdir()
    (checkpoint / "latest").write_text(step)
    names = ["zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    names += (["zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_model_states.pt"] if zero3
              else ["mp_rank_00_model_states.pt"])
    for name in names:
        (checkpoint / step / name).write_bytes(b"")
    (checkpoint / "optimizer.pt").unlink()
    return checkpoint


@pytest.mark.parametrize("written,running,said", [
    ("ddp", {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"},
     r"written under DDP or one process, and this run trains under DeepSpeed ZeRO-1/2: transformers cannot read"),
    ("zero2", {}, r"written under DeepSpeed ZeRO-1/2, and this run trains under DDP or one process: transformers would "
                  r"load its weights and start the optimizer state \(Adam's moments\) again without a word"),
    ("zero2", {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"},
     r"written under DeepSpeed ZeRO-1/2, and this run trains under DeepSpeed ZeRO-3"),
    ("zero3", {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"},
     r"written under DeepSpeed ZeRO-3, and this run trains under DeepSpeed ZeRO-1/2"),
    ("fsdp", {}, r"written under FSDP, and this run trains under DDP or one process: transformers cannot read"),
    ("ddp", {"ACCELERATE_USE_FSDP": "true"}, r"written under DDP or one process, and this run trains under FSDP"),
], ids=["ddp-to-zero2", "zero2-to-ddp", "zero2-to-zero3", "zero3-to-zero2", "fsdp-to-ddp", "ddp-to-fsdp"])
def test_a_checkpoint_resumed_under_another_backend_is_refused_before_the_model_loads(tmp_path, checkpoints,
                                                                                      monkeypatch, written, running,
                                                                                      said):
    """Launched with another accelerate config than the checkpoint's, transformers failed after the model load and
    the offline pass (a bare AssertionError between ZeRO stages, FileNotFoundError pytorch_model_fsdp.bin, "Can't
    find a valid checkpoint"), and from DeepSpeed to DDP it loaded the weights and started Adam's moments again
    without a word (seen with 2-process runs of each pair). Now refused at construction, naming both backends."""
    from transformers import PreTrainedModel

    copy = tmp_path / written / "checkpoint-1"
    shutil.copytree(checkpoints["erpo"], copy)
    if written in ("zero2", "zero3"):
        as_zero2(copy, zero3=written == "zero3")
    if written == "fsdp":  # FSDP2 with FULL_STATE_DICT: pytorch_model_fsdp.bin and optimizer.bin
        (copy / "optimizer.pt").rename(copy / "optimizer.bin")
        (copy / "pytorch_model_fsdp.bin").write_bytes(b"")
    said += r".*Resume with the backend it was written with \(the same accelerate launch --config_file"
    if running:  # the check a trainer runs first at construction, under the launcher's variables
        args = _erpo_args(tmp_path / "resumed")
        for name, value in running.items():
            monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=said):
            check_checkpoint_record(str(copy), "ERPOTrainer", args)
        return

    def fail(cls, *args, **kwargs):
        raise AssertionError("the model was loaded before the checkpoint was refused")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(fail))
    with pytest.raises(ValueError, match=said):
        _trainer("erpo", tmp_path / "resumed", max_steps=2, resume_from_checkpoint=str(copy))


TWO_RANKS_TO_ONE = """
import json, os
import torch
torch.set_num_threads(1)
from trl_variants import ERPOConfig, ERPOTrainer, load_default_dataset
from trl_variants.default import DEFAULT_MODEL_PATH


def text_reward(completions, prompts, trainer_state, **kwargs):  # test_checkpoints.prompt_logging_reward
    with open(os.path.join({out!r}, f"prompts_{{os.environ.get('RANK', '0')}}.jsonl"), "a") as f:
        f.write(json.dumps({{"step": trainer_state.global_step, "prompts": [p[-1]["content"] for p in prompts]}}) + "\\n")
    texts = [c[-1]["content"] for c in completions]
    return [float(sum(map(ord, t)) % 5) / 4 for t in texts]


args = ERPOConfig(output_dir={out!r}, use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none",
                  disable_tqdm=True, save_strategy="steps", save_steps=1, per_device_train_batch_size=2,
                  num_generations=2, max_completion_length=8, learning_rate=1e-3, seed=0, max_steps=6,
                  steps_per_generation={spg})
ERPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=text_reward, args=args,
            train_dataset=load_default_dataset(8, 4)["train"]).train()
print("OK")
"""


def _prompts_per_step(out: Path) -> dict[int, list[str]]:
    steps = {}
    for log in out.glob("prompts_*.jsonl"):
        for line in log.read_text().splitlines():
            row = json.loads(line)
            steps.setdefault(row["step"], []).extend(row["prompts"])
    return {step: sorted(prompts) for step, prompts in steps.items()}


@pytest.mark.slow
@pytest.mark.parametrize("spg", [1, 2], ids=["a-rollout-a-step", "a-rollout-two-steps"])
def test_two_processes_resumed_on_one_train_the_same_prompts(tmp_path, spg):
    """2 gloo processes x 2 rows a step, checkpoint-3 (inside the second epoch), resumed on 1 process x 2 rows x
    gradient_accumulation_steps 2 (and twice the steps_per_generation): every later rollout has the same prompts as
    the uninterrupted run's, generated at the same step (their completions differ: each process had its own random
    state). With a rollout of two steps, checkpoint-3 is inside one: the resumed run generates it again at step 3 (the
    prompts of the uninterrupted run's rollout at step 2) and the next at step 4, where a counter started at 0 went
    one rollout late."""
    whole = tmp_path / "whole"
    whole.mkdir()
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS_TO_ONE.format(out=str(whole), spg=spg))
    run_two_ranks(script, 29571 + spg, timeout=400)
    resumed = tmp_path / "resumed"
    resumed.mkdir()

    def prompt_logging_reward(completions, prompts, trainer_state, **kwargs):
        with open(resumed / "prompts_0.jsonl", "a") as f:
            f.write(json.dumps({"step": trainer_state.global_step, "prompts": [p[-1]["content"] for p in prompts]}) + "\n")
        return text_reward(completions)

    trainer_cls, config_cls = method_classes("erpo")
    args = small_config(config_cls, resumed, **dict(SAVE, per_device_train_batch_size=2, num_generations=2,
                                                    gradient_accumulation_steps=2, steps_per_generation=2 * spg,
                                                    max_steps=6, seed=0))
    trainer = trainer_cls(model=DEFAULT_MODEL_PATH, reward_funcs=prompt_logging_reward, args=args,
                          train_dataset=train_dataset(8))
    with pytest.warns(UserWarning, match=r"written on 2 process\(es\) and this run has 1"):
        trainer.train(resume_from_checkpoint=str(whole / "checkpoint-3"))
    before, after = _prompts_per_step(whole), _prompts_per_step(resumed)  # {step a rollout was generated at: prompts}
    if spg == 1:
        assert sorted(after) == [3, 4, 5] and all(after[step] == before[step] for step in after)
    else:
        assert sorted(before) == [0, 2, 4] and sorted(after) == [3, 4]
        assert after[3] == before[2] and after[4] == before[4]
    assert len(set(map(tuple, after.values()))) > 1  # the rollouts differ from each other: the comparison can fail


def test_a_model_only_checkpoint_is_refused_as_a_resume(tmp_path, checkpoints):
    """save_only_model=True writes the weights alone: transformers resumed such a checkpoint with Adam's moments, the
    learning-rate schedule (warmup again) and the random state started over, without a word."""
    _trainer("erpo", tmp_path / "model_only", save_only_model=True).train()
    model_only = tmp_path / "model_only" / "checkpoint-1"
    assert not [p.name for p in model_only.iterdir() if p.name.startswith(("optimizer", "scheduler", "rng_state"))]
    with pytest.raises(ValueError, match=r"checkpoint-1 holds no optimizer state \(saved with save_only_model=True\).*"
                                         r"Start a new run from its weights"):
        _trainer("erpo", tmp_path / "resumed", max_steps=2, resume_from_checkpoint=str(model_only))
    _trainer("erpo", tmp_path / "full", max_steps=2, resume_from_checkpoint=str(checkpoints["erpo"]))  # accepted


def test_a_rollout_generated_again_keeps_the_runs_rollout_boundaries(tmp_path):
    """A checkpoint inside a rollout without its rollout file: the resumed run generated that rollout again with its
    micro-step counter at 0, so from then on it generated one rollout late (the next rollout's first step trained the
    end of the old one). Now it generates that rollout again at once (the same prompts) and the next where the
    uninterrupted run does."""
    logged = {"whole": tmp_path / "whole.jsonl", "resumed": tmp_path / "resumed.jsonl"}

    def erpo(name, out):
        def prompt_logging_reward(completions, prompts, trainer_state, **kwargs):
            with open(logged[name], "a") as f:
                f.write(json.dumps({"step": trainer_state.global_step,
                                    "prompts": [p[-1]["content"] for p in prompts]}) + "\n")
            return text_reward(completions)

        trainer_cls, config_cls = method_classes("erpo")
        args = small_config(config_cls, out, **dict(SAVE, num_generations=2, max_steps=6, steps_per_generation=2))
        return trainer_cls(model=DEFAULT_MODEL_PATH, reward_funcs=prompt_logging_reward, args=args,
                           train_dataset=train_dataset(16))

    erpo("whole", tmp_path / "whole").train()
    old = tmp_path / "old" / "checkpoint-3"
    shutil.copytree(tmp_path / "whole" / "checkpoint-3", old)
    (old / "rollout_0.pt").unlink()
    with pytest.warns(UserWarning, match=r"holds no rollout_0\.pt"):
        erpo("resumed", tmp_path / "resumed").train(resume_from_checkpoint=str(old))
    rollouts = {name: [json.loads(line) for line in path.read_text().splitlines()] for name, path in logged.items()}
    before = {r["step"]: sorted(r["prompts"]) for r in rollouts["whole"]}
    after = {r["step"]: sorted(r["prompts"]) for r in rollouts["resumed"]}
    assert sorted(before) == [0, 2, 4] and sorted(after) == [3, 4]
    assert after[3] == before[2] and after[4] == before[4] and before[2] != before[4]


def test_dph_rehearsal_rows_per_step_are_kept_on_another_number_of_processes(tmp_path, checkpoints):
    """DPH-RL's pef_batch_size is D_pef rows per micro-step per process: on another number of processes it may change
    with the split of the batch, and D_pef's rows per optimizer step may not (the stream would drift)."""
    two = _record_on(checkpoints["dph"], tmp_path / "two" / "checkpoint-1", world_size=2, per_device_train_batch_size=2,
                     pef_batch_size=1)  # 2 processes x 1 row: 2 D_pef rows a step
    _, config_cls = method_classes("dph")
    def config(pef_batch_size):
        return small_config(config_cls, tmp_path, **dict(SAVE, num_presamples=4, pef_threshold=4,
                                                         max_completion_length=40, pef_batch_size=pef_batch_size))

    check_checkpoint_record(str(two), "DPHTrainer", config(2))  # 1 process x 2 rows: accepted
    halved = config(1)
    with pytest.raises(ValueError, match=r"pef_batch_size x processes x gradient_accumulation_steps is 2 in the "
                                         r"checkpoint \(1 there\) and 1 in this run \(1\)"):
        check_checkpoint_record(str(two), "DPHTrainer", halved)


def test_the_same_backend_is_accepted_and_a_deepspeed_json_names_its_stage(tmp_path, checkpoints, monkeypatch):
    from trl_variants._checkpoint_layout import check_same_backend

    args = _erpo_args(tmp_path)
    zero2 = as_zero2(_record_on(checkpoints["erpo"], tmp_path / "z2" / "checkpoint-1"))
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    check_same_backend(str(zero2), args)
    monkeypatch.delenv("ACCELERATE_DEEPSPEED_ZERO_STAGE")  # accelerate launch with a deepspeed_config_file
    ds_json = tmp_path / "ds.json"
    ds_json.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(ds_json))
    with pytest.raises(ValueError, match=r"written under DeepSpeed ZeRO-1/2, and this run trains under DeepSpeed ZeRO-3"):
        check_same_backend(str(zero2), args)
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    monkeypatch.delenv("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    fsdp = _record_on(checkpoints["erpo"], tmp_path / "fsdp" / "checkpoint-1")
    (fsdp / "optimizer.pt").rename(fsdp / "optimizer.bin")
    (fsdp / "pytorch_model_fsdp.bin").write_bytes(b"")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    check_same_backend(str(fsdp), args)

