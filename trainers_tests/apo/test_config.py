"""APOConfig refuses the GRPO options its regression loss does not use: a changed value is named, with
the reason and the fix, instead of being silently ignored."""

from dataclasses import fields

import pytest
from trl import GRPOConfig

from trl_variants import APOConfig
from trl_variants.apo.config import UNUSED_GRPO_OPTIONS

# one value different from GRPOConfig's default for every option A*-PO ignores
CHANGED = {
    "loss_type": "grpo", "epsilon": 0.3, "epsilon_high": 0.28, "delta": 2.0, "importance_sampling_level": "sequence",
    "sapo_temperature_neg": 2.0, "sapo_temperature_pos": 2.0, "vespo_k_pos": 1.0, "vespo_lambda_pos": 1.0,
    "vespo_k_neg": 1.0, "vespo_lambda_neg": 1.0, "scale_rewards": "batch",
    "multi_objective_aggregation": "normalize_then_sum", "top_entropy_quantile": 0.2, "use_adaptive_entropy": True,
    "off_policy_mask_threshold": 0.5, "use_bias_correction_kl": False, "vllm_importance_sampling_mode": "token_truncate",
    "vllm_importance_sampling_clip_max": 2.0, "vllm_importance_sampling_clip_min": 0.5,
    "vllm_importance_sampling_cap": 2.0, "mask_truncated_completions": True, "sync_ref_model": True,
}
CPU = dict(output_dir="x", use_cpu=True, bf16=False)


def test_every_listed_option_is_a_grpo_option_and_has_a_changed_value():
    grpo_fields = {f.name: f.default for f in fields(GRPOConfig)}
    assert set(UNUSED_GRPO_OPTIONS) <= set(grpo_fields), "a TRL upgrade renamed or removed one (docs/UPGRADING.md)"
    assert set(CHANGED) == set(UNUSED_GRPO_OPTIONS)
    for name, value in CHANGED.items():
        assert value != grpo_fields[name], name


@pytest.mark.parametrize("name", sorted(UNUSED_GRPO_OPTIONS))
def test_changed_unused_option_is_refused_by_name(name):
    with pytest.raises(ValueError, match=rf"APOConfig\.{name}=.* has no effect in A\*-PO: .*Remove it"):
        APOConfig(**CPU, **{name: CHANGED[name]})


def test_defaults_given_explicitly_and_used_options_are_accepted():
    grpo_fields = {f.name: f.default for f in fields(GRPOConfig)}
    config = APOConfig(**CPU, **{name: grpo_fields[name] for name in UNUSED_GRPO_OPTIONS})
    assert config.loss_type == "dapo" and config.num_generations == 1
    # options the regression does use stay free: beta (beta2), the entropy bonus, reward weights, passes per batch
    config = APOConfig(**CPU, beta=0.01, entropy_coef=0.001, reward_weights=[1.0], num_iterations=2)
    assert (config.beta, config.entropy_coef, config.num_iterations) == (0.01, 0.001, 2)
