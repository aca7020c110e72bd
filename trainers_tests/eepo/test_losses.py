"""EEPO's own tensor math (``trl_variants/eepo/losses.py``) against numbers computed by hand."""

import math

import pytest
import torch

from trl_variants.eepo import losses

# ------------------------------------------------------------------------- vLLM sampler/trainer correction ---
_NAN = float("nan")
_IS_OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -0.1, 0.0]])
_IS_SAMPLING = torch.tensor([[-1.5, -1.0, 7.0], [-0.2, _NAN, _NAN]])  # NaN: a token vLLM could not score
_IS_MASK = torch.tensor([[1, 1, 0], [1, 1, 0]])
# differences (old - sampling) * mask: row 0 [0.5, -1.0, 0], row 1 [0, 0 (NaN -> 0), 0]; row sums -0.5 and 0
_E = math.exp


@pytest.mark.parametrize("mode, clip_min, clip_max, expected", [
    ("token_truncate", 0.5, 1.5, [[1.5, 0.5, 1.0], [1.0, 1.0, 1.0]]),  # e^0.5 = 1.65 -> 1.5, e^-1 = 0.37 -> 0.5
    ("token_truncate", None, 1.5, [[1.5, _E(-1.0), 1.0], [1.0, 1.0, 1.0]]),  # the cap alone
    ("token_truncate", None, None, [[_E(0.5), _E(-1.0), 1.0], [1.0, 1.0, 1.0]]),  # no bound at all
    ("token_mask", 0.5, 1.5, [[0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]),  # outside [0.5, 1.5] -> 0
    ("token_mask", None, 3.0, [[_E(0.5), _E(-1.0), 1.0], [1.0, 1.0, 1.0]]),
    ("sequence_truncate", 0.7, 3.0, [[0.7], [1.0]]),  # e^-0.5 = 0.61 -> 0.7
    ("sequence_truncate", None, 3.0, [[_E(-0.5)], [1.0]]),
    ("sequence_mask", 0.7, 3.0, [[0.0], [1.0]]),
    ("sequence_mask", None, 3.0, [[_E(-0.5)], [1.0]]),  # TRL's defaults
    ("sequence_mask", None, 0.8, [[_E(-0.5)], [0.0]]),  # a cap below 1 masks the matching row (ratio 1)
])
def test_vllm_importance_sampling_ratio_hand_computed(mode, clip_min, clip_max, expected):
    ratio = losses.vllm_importance_sampling_ratio(_IS_OLD, _IS_SAMPLING, _IS_MASK, mode, clip_min, clip_max)
    torch.testing.assert_close(ratio, torch.tensor(expected))


def test_vllm_importance_sampling_ratio_defaults_and_bad_mode():
    default = losses.vllm_importance_sampling_ratio(_IS_OLD, _IS_SAMPLING, _IS_MASK)  # TRL's: sequence_mask, cap 3
    torch.testing.assert_close(default, torch.tensor([[_E(-0.5)], [1.0]]))
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode must be one of"):
        losses.vllm_importance_sampling_ratio(_IS_OLD, _IS_SAMPLING, _IS_MASK, "token_clip")


def test_still_importable_from_the_shared_losses_module():
    from trl_variants import losses as shared

    assert shared.vllm_importance_sampling_ratio is losses.vllm_importance_sampling_ratio
    assert shared.VLLM_IMPORTANCE_SAMPLING_MODES == losses.VLLM_IMPORTANCE_SAMPLING_MODES
    with pytest.raises(AttributeError, match="no attribute 'no_such_loss'"):
        shared.no_such_loss  # noqa: B018
