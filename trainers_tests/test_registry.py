"""`trl_variants.registry`: one entry per method, read by the CLI, the tests' helpers and the benchmarks."""

import pytest
import trl

import trl_variants
from trl_variants.registry import PAPER_METHODS, REGISTRY, method_classes


def test_every_method_names_its_classes_and_the_cli_lists_them_in_order():
    from trl_variants import recipe_catalog

    assert list(REGISTRY) == ["erpo", "eepo", "dph", "apo", "composed", "grpo"] == list(recipe_catalog.METHODS)
    assert method_classes("erpo") == (trl_variants.ERPOTrainer, trl_variants.ERPOConfig)
    assert method_classes("composed") == (trl_variants.ComposedTrainer, trl_variants.ComposedConfig)
    assert method_classes("grpo") == (trl.GRPOTrainer, trl.GRPOConfig)
    assert set(PAPER_METHODS) < set(REGISTRY)
    assert [REGISTRY[m].label for m in PAPER_METHODS] == ["ERPO", "EEPO", "DPH-RL", "A*-PO"]


def test_an_unknown_method_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="unknown method 'ppo': choose one of erpo, eepo, dph, apo, composed, grpo"):
        method_classes("ppo")
