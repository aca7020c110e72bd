"""EEPO's read of stage 2's log-probs while generating, under GRPOConfig's generation engines: a static KV cache
(``cache_implementation="static"``) keeps it (``generate`` still runs the trainer's module one step at a time);
continuous batching falls back with a warning (trainers_tests/presample/test_continuous_batching.py)."""

import warnings

import pytest
import torch

from .test_trainer import _stage2_rollout

STATIC = dict(cache_implementation="static", max_completion_length=12)


@pytest.mark.slow
def test_stage2_logps_read_under_a_static_cache_equal_the_separate_forward(tmp_path):
    """With a static KV cache the default still reads stage 2's old log-probs from generate's own passes (no
    fallback warning), and they are the separate forward's up to float32 rounding, for the same tokens."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="EEPO")  # a fallback to the forward would make this test vacuous
        c_read, old_read, m_read = _stage2_rollout(tmp_path, "read", **STATIC)
    c_fwd, old_fwd, m_fwd = _stage2_rollout(tmp_path, "forward", capture_stage2_logps=False, **STATIC)
    assert c_read == c_fwd  # same seed, same unlearned weights: the same tokens
    assert [len(r) for r in old_read] == [len(c) for c in c_read] and sum(map(len, c_read)) > len(c_read)
    for a, b in zip(old_read, old_fwd, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-4, rtol=0)
    for k in m_fwd:
        assert m_read[k] == pytest.approx(m_fwd[k], abs=1e-5), k


def test_bf16_compute_says_once_that_stage2_is_scored_in_a_separate_forward(tmp_path, monkeypatch):
    """With bf16 compute (a GPU run) the default scores stage 2 in a separate forward: said once, naming why and
    both ways to choose. bf16 from `accelerate launch` (its config's mixed_precision) counts as bf16: true does."""
    from ..helpers import small_trainer

    with pytest.warns(UserWarning, match=r"not read while generating with bf16 compute.*capture_stage2_logps=True"):
        eepo = small_trainer("eepo", tmp_path / "bf16", bf16=True, max_steps=1)
    assert [p.capture for p in eepo.parts if p.owns_rollout] == [False]
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    with pytest.warns(UserWarning, match=r"not read while generating with bf16 compute"):
        eepo = small_trainer("eepo", tmp_path / "launched", max_steps=1)
    assert not eepo.args.bf16 and [p.capture for p in eepo.parts if p.owns_rollout] == [False]
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="EEPO")
        small_trainer("eepo", tmp_path / "fp32", max_steps=1)  # float32: read while generating, nothing to say
