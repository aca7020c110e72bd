"""EEPO's tensor math beside the shared :mod:`trl_variants.losses`: vLLM's sampler/trainer importance-sampling ratio,
which EEPO recomputes for its stage-2 rows against the weights that sampled them (docs/eepo.md, "With vLLM"). The
function mirrors GRPOTrainer's own inline formula, so it lives with the shared losses; it is named here for EEPO.
"""

from __future__ import annotations

from ..losses import VLLM_IMPORTANCE_SAMPLING_MODES, vllm_importance_sampling_ratio

__all__ = ["VLLM_IMPORTANCE_SAMPLING_MODES", "vllm_importance_sampling_ratio"]
