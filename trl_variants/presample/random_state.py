"""The random state the offline pass leaves behind: as it found it (:func:`preserved_random_state`)."""

from __future__ import annotations

import random
from contextlib import contextmanager

import numpy as np
import torch


@contextmanager
def preserved_random_state():
    """Leave the random state as it was found: torch's CPU generator, this process's CUDA device's and the MPS / XPU
    generator where one is in use, python's ``random``, numpy's global generator. Around an offline pass (which seeds
    torch per shard when it samples, and draws nothing when it reads its cache or the dataset's stored columns), so the
    rollouts that follow draw the same numbers whether the pass was computed, read or run lazily during training. (A
    process that has not used CUDA yet has no CUDA state to keep, and no other device's context is created.)"""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    devices = [torch.cuda.current_device()] if cuda else []
    others = [(module, module.get_rng_state()) for module in _other_device_generators()]  # torch.manual_seed seeds them
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        for module, state in others:
            module.set_rng_state(state)


def _other_device_generators() -> list:
    """The device modules besides CUDA whose default generator ``torch.manual_seed`` also seeds and which this
    process uses: Apple's MPS (when available) and Intel's XPU (once initialized)."""
    found = []
    if torch.backends.mps.is_available():
        found.append(torch.mps)
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available() and xpu.is_initialized():
        found.append(xpu)
    return found
