"""DAPO's dynamic sampling (arXiv:2503.14476, Sec. 3.2): a part every GRPO-family trainer here can turn on
(``dynamic_sampling=True``); the box is ``part.py``."""

from .config import DynamicSamplingConfig
from .part import DynamicSampling, groups_with_signal, with_dynamic_sampling

__all__ = ["DynamicSampling", "DynamicSamplingConfig", "groups_with_signal", "with_dynamic_sampling"]
