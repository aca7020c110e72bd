"""A run does not depend on where its offline pass came from: the pass leaves the random state (torch, python
``random``, numpy) as it found it, so DPH-RL and A*-PO train the same whether the pass was computed or read from the
cache, and A*-PO's lazy stage 1 trains as its full pass. Each run in a fresh process: in one process a second
trainer's construction reseeds, which hid the difference."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trl_variants import accuracy_reward
from trl_variants.default import DEFAULT_MODEL_PATH
from trl_variants.presample import PresampleConfig, presample

from ..helpers import train_dataset

RUN = """
import json, sys
import torch
torch.set_num_threads(1)
from trainers_tests.helpers import small_trainer, train_dataset

method, out, cache, lazy = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
source = "cache" if any(__import__("pathlib").Path(cache).glob("*/dataset/state.json")) else "computed"
kw = dict(presample_cache_dir=cache, max_completion_length=12)
if method == "apo":
    kw.update(per_device_train_batch_size=4, presample_shard_size=4, lazy_value_chunk_size=4,
              lazy_value_pass=lazy == "lazy")
trainer = small_trainer(method, __import__("pathlib").Path(out), dataset=train_dataset(32 if method == "apo" else 16),
                        **kw)
if method == "apo":
    assert (trainer._lazy is not None) == (lazy == "lazy")
trainer.train()
torch.save({k: v.detach().clone() for k, v in trainer.model.state_dict().items()}, out + "/weights.pt")
losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
json.dump({"losses": losses, "pass": source}, open(out + "/run.json", "w"))
"""


def _launch(tmp_path, name, method, cache, lazy="full"):
    out = tmp_path / name
    out.mkdir()
    script = tmp_path / "run.py"
    script.write_text(RUN)
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]))
    return out, subprocess.Popen([sys.executable, str(script), method, str(out), str(cache), lazy], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(runs):
    results = {}
    for name, (out, proc) in runs.items():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        results[name] = (json.loads((out / "run.json").read_text()), torch.load(out / "weights.pt"))
    return results


def _assert_same_training(a, b):
    (run_a, w_a), (run_b, w_b) = a, b
    assert len(run_a["losses"]) == 2 and run_a["losses"] == run_b["losses"]
    assert w_a.keys() == w_b.keys() and all(torch.equal(w_a[k], w_b[k]) for k in w_a)


@pytest.mark.slow
def test_pass_computed_read_or_lazy_trains_the_same(tmp_path):
    """DPH-RL and A*-PO (full stage 1), trained 2 steps in a fresh process with the pass computed, then again reading
    it from that cache; A*-PO's lazy stage 1 (its own cache: it samples too): identical losses and weights."""
    first = {"dph": _launch(tmp_path, "dph_computed", "dph", tmp_path / "dph_cache"),
             "apo": _launch(tmp_path, "apo_computed", "apo", tmp_path / "apo_cache")}
    computed = _wait(first)
    second = {"dph": _launch(tmp_path, "dph_read", "dph", tmp_path / "dph_cache"),
              "apo": _launch(tmp_path, "apo_read", "apo", tmp_path / "apo_cache")}
    read = _wait(second)
    lazy = _wait({"apo": _launch(tmp_path, "apo_lazy", "apo", tmp_path / "lazy_cache", "lazy")})["apo"]
    for method in ("dph", "apo"):
        assert computed[method][0]["pass"] == "computed" and read[method][0]["pass"] == "cache", method
        _assert_same_training(computed[method], read[method])
    _assert_same_training(computed["apo"], lazy)


def _state():
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state()


def test_presample_leaves_the_random_state_as_it_found_it(tmp_path):
    """The pass seeds torch per shard: computed or read from the cache, the random state after it is the state
    before it (and :func:`preserved_random_state` restores what its body draws)."""
    from trl_variants._offline import preserved_random_state

    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    before = _state()
    config = PresampleConfig(num_samples=2, max_completion_length=8, cache_dir=str(tmp_path), show_progress=False)
    for _ in ("computed", "cached"):
        presample(DEFAULT_MODEL_PATH, None, train_dataset(4), accuracy_reward, config)
        after = _state()
        assert after[0] == before[0] and after[1] == before[1] and torch.equal(after[2], before[2])
    with preserved_random_state():
        torch.rand(3), random.random(), np.random.rand()
    after = _state()
    assert after[0] == before[0] and after[1] == before[1] and torch.equal(after[2], before[2])


def test_an_mps_generator_is_restored_too(monkeypatch):
    """On a Mac the pass's torch.manual_seed also seeds the MPS generator: it is put back (a fake MPS here)."""
    from trl_variants.presample import random_state

    class FakeMPS:
        state = torch.tensor([1, 2, 3], dtype=torch.uint8)

        @classmethod
        def get_rng_state(cls):
            return cls.state.clone()

        @classmethod
        def set_rng_state(cls, state):
            cls.state = state

    monkeypatch.setattr(random_state, "_other_device_generators", lambda: [FakeMPS])
    with random_state.preserved_random_state():
        FakeMPS.state = torch.tensor([9, 9, 9], dtype=torch.uint8)  # what seeding it would do
    assert FakeMPS.state.tolist() == [1, 2, 3]
