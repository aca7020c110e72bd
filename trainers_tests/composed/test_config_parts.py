"""``ComposedConfig`` checks only the parts it runs: each part's own checks run only when the part is in ``parts``; an
option of a part that is not, set to anything but its default, is refused by name; ``use_query_weights=False`` with
the query-weights part is refused as contradictory; ``parts`` not given warns that the default runs. Every refusal
here was accepted before (the option silently did nothing), and the ERPO-only config below was refused by EEPO's
check."""

import dataclasses
import re
import warnings

import pytest
from transformers import TrainingArguments
from trl import GRPOConfig

from trl_variants import ComposedConfig
from trl_variants.composed.config import DEFAULT_PARTS, GENERAL_OPTIONS, OPTION_PARTS, PART_NAMES

COMMON = dict(output_dir="x", use_cpu=True, bf16=False, report_to="none")


def _refusal(option, owners, parts):
    owner = " or ".join(repr(o) for o in owners)
    return re.escape(f"ComposedConfig: {option} is an option of part {owner}, which is not in parts={parts}: add the "
                     "part or drop the option")


@pytest.mark.parametrize("parts,option,value,owners", [
    (["erpo_query_kl"], "use_query_weights", False, ("erpo_query_weights",)),
    (["erpo_query_kl"], "query_weight_source", "reference", ("erpo_query_weights",)),
    (["erpo_query_weights"], "query_kl_coef", 0.5, ("erpo_query_kl",)),
    ([], "reference_batch_size", 4, ("erpo_query_weights", "erpo_query_kl")),
    (["erpo_query_weights", "erpo_query_kl"], "num_presamples", 16, ("dph_rehearsal",)),
    (["eepo_two_stage_rollout"], "divergence", "forward_kl", ("dph_rehearsal",)),
    (["dapo_dynamic_sampling"], "presample_cache_dir", "cache", ("dph_rehearsal",)),
    (["erpo_query_kl", "dph_rehearsal"], "entropy_gate", "always", ("eepo_two_stage_rollout",)),
    (["erpo_query_kl"], "dynamic_sampling_max_rounds", 3, ("dapo_dynamic_sampling",)),
])
def test_an_option_of_a_part_that_does_not_run_is_refused_by_name(parts, option, value, owners):
    with pytest.raises(ValueError, match=_refusal(option, owners, parts)):
        ComposedConfig(parts=parts, **{option: value}, **COMMON)
    if option != "use_query_weights":  # with its part: accepted (use_query_weights=False: below)
        ComposedConfig(parts=[*parts, owners[0]], **{option: value}, **COMMON)


def test_every_refused_option_is_named():
    with pytest.raises(ValueError) as refused:
        ComposedConfig(parts=["erpo_query_kl"], num_presamples=16, entropy_gate="always", **COMMON)
    assert "num_presamples is an option of part 'dph_rehearsal'" in str(refused.value)
    assert "entropy_gate is an option of part 'eepo_two_stage_rollout'" in str(refused.value)


def test_options_at_their_defaults_and_general_options_are_accepted_without_their_part():
    args = ComposedConfig(parts=["erpo_query_kl"], use_query_weights=True, num_presamples=8, entropy_gate="auto",
                          loss_combination="count_weighted", **COMMON)
    assert args.parts == ["erpo_query_kl"] and args.loss_combination == "count_weighted"


def test_use_query_weights_false_with_the_query_weights_part_is_contradictory():
    with pytest.raises(ValueError, match=r"use_query_weights=False contradicts parts, which holds "
                                         r"'erpo_query_weights'"):
        ComposedConfig(parts=["erpo_query_weights", "erpo_query_kl"], use_query_weights=False, **COMMON)


def test_an_erpo_run_is_not_refused_by_eepos_check(monkeypatch):
    """2 processes of 2 rows each and groups of 4: GRPO's generation batch (4 rows) holds whole groups, but no process
    does, which only EEPO's rollout needs ("EEPO needs whole groups"). Without EEPO's part, its check does not run."""
    monkeypatch.setattr(TrainingArguments, "world_size", property(lambda self: 2))
    batch = dict(per_device_train_batch_size=2, num_generations=4)
    args = ComposedConfig(parts=["erpo_query_weights", "erpo_query_kl", "dph_rehearsal"], **batch, **COMMON)
    assert args.generation_batch_size == 4
    with pytest.raises(ValueError, match="EEPO needs whole groups on every process"):
        ComposedConfig(parts=["erpo_query_kl", "eepo_two_stage_rollout"], **batch, **COMMON)


@pytest.mark.parametrize("parts,option,value,message", [
    (["erpo_query_kl"], "query_kl_estimator", "k2", "query_kl_estimator must be 'k3' or 'k1'"),
    (["erpo_query_weights"], "query_weight_max", 0.0, "query_weight_max must be > 0"),
    (["dph_rehearsal"], "divergence", "nope", "divergence must be one of"),
    (["eepo_two_stage_rollout"], "entropy_window", 0, "entropy_window must be >= 1"),
])
def test_a_chosen_part_checks_its_own_options(parts, option, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ComposedConfig(parts=parts, **{option: value}, **COMMON)


def test_the_default_parts_are_announced():
    with pytest.warns(UserWarning, match=re.escape(f"ComposedConfig.parts not given: running the default "
                                                   f"{list(DEFAULT_PARTS)}")):
        args = ComposedConfig(**COMMON)
    assert args.parts == list(DEFAULT_PARTS)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert ComposedConfig(parts=list(DEFAULT_PARTS), **COMMON).parts == list(DEFAULT_PARTS)


def test_every_option_belongs_to_a_part_or_to_all():
    """A field added to ERPO's, DPH-RL's or EEPO's config later is given a part (or declared general) here."""
    grpo = {f.name for f in dataclasses.fields(GRPOConfig)}
    own = {f.name for f in dataclasses.fields(ComposedConfig)} - grpo
    assert own == set(OPTION_PARTS) | set(GENERAL_OPTIONS)
    assert {p for owners in OPTION_PARTS.values() for p in owners} == set(PART_NAMES)


def test_a_built_in_part_is_given_by_name_not_as_an_instance():
    """An instance would train with its own options while the records and resume checks keep the config's."""
    from trl_variants.erpo.part import QueryKL

    with pytest.raises(ValueError, match="give the built-in part 'erpo_query_kl' by its name, not as an instance"):
        ComposedConfig(parts=[QueryKL(0.05, "k3")], **COMMON)


def test_the_built_in_part_names_are_the_registry_s():
    from trl_variants.parts import registered_parts

    assert set(PART_NAMES) <= set(registered_parts()) and len(PART_NAMES) == 5
    assert list(PART_NAMES) == registered_parts()[:5]  # the two lists stay one
