"""Config values refused when the config is built, naming the field and the fix (``trl_variants/_config_checks.py``
and each method config's own checks): values that used to pass every check and then trained wrongly without a word
(a NaN coefficient turning a term off), or failed only after the model load and the offline pass (a batch of 0
rows, an unknown loss type, a misspelled correctness reward)."""

from __future__ import annotations

import inspect
import math
import re

import pytest
from datasets import Dataset
from transformers import PreTrainedModel
from trl import GRPOConfig

from trainers_tests.helpers import TRAINERS, small_config
from trl_variants import (
    DEFAULT_MODEL_PATH,
    APOConfig,
    ComposedConfig,
    DPHConfig,
    DPHTrainer,
    EEPOConfig,
    ERPOConfig,
    accuracy_reward,
)
from trl_variants._config_checks import TRL_CHOICES
from trl_variants.presample import PresampleConfig

CONFIGS = [c for _, c in TRAINERS.values()]
IDS = list(TRAINERS)
NAN, INF = math.nan, math.inf


def _config(config_cls, tmp_path, **kw):
    batch = dict(per_device_train_batch_size=2, num_generations=1) if config_cls is APOConfig else \
        dict(per_device_train_batch_size=4, num_generations=2)
    if config_cls is ComposedConfig:
        kw.setdefault("parts", ["erpo_query_weights", "erpo_query_kl", "dph_rehearsal"])
    return small_config(config_cls, tmp_path, **{**batch, "max_steps": 1, **kw})


# ----------------------------------------------------------------------------- GRPOConfig's options ---
@pytest.mark.parametrize("config_cls", CONFIGS, ids=IDS)
@pytest.mark.parametrize("field,value,fix", [
    ("per_device_train_batch_size", 0, "batch arithmetic"), ("gradient_accumulation_steps", 0, "batch arithmetic"),
    ("steps_per_generation", -1, "batch arithmetic"), ("beta", NAN, "turns the KL off"),
    ("max_grad_norm", NAN, "gradient-clipping norm"), ("loss_type", "foo", "reads no other value"),
])
def test_values_that_failed_after_the_model_load_or_trained_wrongly(config_cls, field, value, fix, tmp_path):
    with pytest.raises(ValueError, match=rf"{config_cls.__name__}\.{field} must be .*{fix}"):
        _config(config_cls, tmp_path, **{field: value})


@pytest.mark.parametrize("field,value,fix", [
    ("beta", -0.1, "pushes the policy away"), ("beta", INF, "turns the KL off"),
    ("entropy_coef", NAN, "entropy bonus off"), ("top_entropy_quantile", -0.5, "highest-entropy tokens"),
    ("top_entropy_quantile", 2.0, "highest-entropy tokens"), ("delta", -1.0, "on-policy ratio"),
    ("delta", 1.0, "on-policy ratio"), ("scale_rewards", "false", "write 'none'"),
    ("scale_rewards", "foo", "reads no other value"), ("importance_sampling_level", "tokens", "reads no other"),
    ("multi_objective_aggregation", "mean", "reads no other"), ("generation_batch_size", 0, "batch arithmetic"),
])
def test_grpo_options_are_checked_for_the_grpo_family(field, value, fix, tmp_path):
    with pytest.raises(ValueError, match=rf"ERPOConfig\.{field} must be .*{fix}"):
        _config(ERPOConfig, tmp_path, **{field: value, "steps_per_generation": None}
                if field == "generation_batch_size" else {field: value})


def test_sane_grpo_options_pass(tmp_path):
    config = _config(ERPOConfig, tmp_path, scale_rewards=False, delta=4.0, top_entropy_quantile=0.2,
                     loss_type="dr_grpo", importance_sampling_level="sequence", max_grad_norm=None, beta=0.04)
    assert (config.scale_rewards, config.delta) == ("none", 4.0)  # GRPOConfig maps False to "none"


def test_two_generation_engines_are_refused(tmp_path):
    with pytest.raises(ValueError, match="use_vllm and use_transformers_continuous_batching are both set.*choose one"):
        _config(ERPOConfig, tmp_path, use_vllm=True, use_transformers_continuous_batching=True)


def _documented_values(field: str) -> tuple[set[str], set[str]]:
    """The quoted values in GRPOConfig's docstring entry for ``field``, and those of them it lists as bullets."""
    doc = inspect.getdoc(GRPOConfig)
    entry = re.search(rf"^    {field} \(.*?(?=^    \w+ \(|\Z)", doc, flags=re.M | re.S).group(0)
    return set(re.findall(r'`"(\w+)"`', entry)), set(re.findall(r'^\s+- `"(\w+)"`', entry, flags=re.M))


@pytest.mark.parametrize("field", sorted(TRL_CHOICES))
def test_trl_choices_are_the_values_trl_documents(field):
    """An upgrade of TRL that adds a loss type (or another value) fails here: add it to TRL_CHOICES."""
    quoted, bullets = _documented_values(field)
    assert set(TRL_CHOICES[field]) <= quoted, f"{field}: TRL's docstring no longer names {set(TRL_CHOICES[field]) - quoted}"
    assert bullets <= set(TRL_CHOICES[field]), f"{field}: TRL documents {bullets - set(TRL_CHOICES[field])} as well"


# ---------------------------------------------------------------------------- each method's own fields ---
@pytest.mark.parametrize("config_cls,field,value,message", [
    (ERPOConfig, "query_kl_coef", NAN, "query_kl_coef (alpha) must be >= 0 and finite"),  # Query-KL silently off
    (ERPOConfig, "query_kl_coef", INF, "query_kl_coef (alpha) must be >= 0 and finite"),
    (ERPOConfig, "query_weight_max", NAN, "query_weight_max must be > 0 and finite"),
    (DPHConfig, "dph_coef", NAN, "dph_coef (eta) must be >= 0 and finite"),
    (DPHConfig, "correctness_threshold", NAN, "correctness_threshold must be a number and finite"),
    (EEPOConfig, "unlearning_lr", INF, "unlearning_lr (eta) must be > 0 and finite"),
    (EEPOConfig, "entropy_threshold", NAN, "entropy_threshold (alpha) must be > 0 and finite"),  # gate never opened
    (EEPOConfig, "entropy_threshold", -1.0, "entropy_threshold (alpha) must be > 0 and finite"),
    (APOConfig, "beta", INF, "APOConfig.beta must be a finite number >= 0"),
    (APOConfig, "correctness_threshold", NAN, "correctness_threshold must be a number and finite"),
])
def test_a_method_coefficient_that_is_nan_or_infinite_is_refused(config_cls, field, value, message, tmp_path):
    with pytest.raises(ValueError, match=re.escape(message)):
        _config(config_cls, tmp_path, **{field: value})


@pytest.mark.parametrize("config_cls,field,value,message", [
    # each failed only after the offline pass or at the first rollout or loss, with a bare TypeError
    (DPHConfig, "dph_coef", "0.2", "DPHConfig.dph_coef must be a number (str given), got '0.2': pass a number, "
                                   "not a string (a YAML file read by hand reads 1e-6"),
    (DPHConfig, "num_presamples", 8.0, "DPHConfig.num_presamples must be an integer (float given), got 8.0: pass "
                                       "the whole number 8"),
    (EEPOConfig, "entropy_threshold", "0.3", "EEPOConfig.entropy_threshold must be a number (str given)"),
    (EEPOConfig, "entropy_window", 2.5, "EEPOConfig.entropy_window must be an integer (float given), got 2.5: pass "
                                        "an integer"),
    (APOConfig, "value_beta", "0.5", "APOConfig.value_beta must be a number (str given)"),
    (ERPOConfig, "use_query_weights", "false", "ERPOConfig.use_query_weights must be True or False (str given), got "
                                               "'false': pass True or False, not a string (the string 'false' is true)"),
    (ERPOConfig, "query_kl_coef", True, "ERPOConfig.query_kl_coef must be a number (bool given)"),
    # GRPOConfig's own: TRL takes them and fails at the first step
    (ERPOConfig, "learning_rate", "1e-6", "ERPOConfig.learning_rate must be a number (str given)"),
    (ERPOConfig, "num_generations", 2.0, "ERPOConfig.num_generations must be an integer (float given), got 2.0: "
                                         "pass the whole number 2"),
])
def test_a_value_of_another_type_than_the_field_is_refused_naming_it(config_cls, field, value, message, tmp_path):
    with pytest.raises(ValueError, match=re.escape(message)):
        _config(config_cls, tmp_path, **{field: value})


def test_numpy_numbers_and_ints_for_floats_are_numbers(tmp_path):
    import numpy as np

    config = _config(EEPOConfig, tmp_path, entropy_threshold=np.float32(0.3), entropy_window=np.int64(4),
                     unlearning_lr=1, learning_rate=np.float64(1e-6))
    assert config.entropy_window == 4 and config.unlearning_lr == 1
    # stored as Python numbers: the config's JSON (trackers, checkpoints' records) and the cache keys read them
    assert type(config.entropy_window) is int and type(config.entropy_threshold) is float
    assert type(config.learning_rate) is float


def test_an_alpha_divergence_with_no_alpha_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"DPHConfig\.divergence_alpha must be a number and finite, got nan"):
        _config(DPHConfig, tmp_path, divergence="alpha", divergence_alpha=NAN)
    assert _config(DPHConfig, tmp_path, divergence="alpha", divergence_alpha=1e-9).divergence_alpha == 1e-9


def test_apo_with_one_row_per_process_names_its_own_batch_not_a_stand_in(tmp_path):
    """A*-PO passes GRPOConfig's group check with a stand-in num_generations; the stand-in divides the batch now
    (it was 2, which an odd generation batch failed with "divisible by num_generations (2)", a value never set)."""
    config = _config(APOConfig, tmp_path, per_device_train_batch_size=1, gradient_accumulation_steps=3)
    assert (config.num_generations, config.generation_batch_size) == (1, 3)
    with pytest.raises(ValueError, match=r"A\*-PO's generation batch is 1 row .*per_device_train_batch_size"):
        _config(APOConfig, tmp_path, per_device_train_batch_size=1, gradient_accumulation_steps=1)


def test_a_misspelled_correctness_reward_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    def fail(cls, *args, **kwargs):
        raise AssertionError("the model loaded before correctness_reward was checked")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(fail))
    data = Dataset.from_dict({"prompt": ["What is 2 + 3?"] * 4, "solution": ["5"] * 4})
    args = _config(DPHConfig, tmp_path, correctness_reward="accuracy")
    with pytest.raises(ValueError, match=r"correctness_reward='accuracy' is not one of the reward functions "
                                         r"\['accuracy_reward'\]"):
        DPHTrainer(DEFAULT_MODEL_PATH, accuracy_reward, args=args, train_dataset=data)


# ------------------------------------------------------------------------------- the offline pass's ---
@pytest.mark.parametrize("field,value", [("temperature", INF), ("repetition_penalty", INF), ("top_k", NAN)])
def test_presample_sampling_options_must_be_finite(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        PresampleConfig(**{field: value})


@pytest.mark.parametrize("value,why", [("5", "a JSON object"), ("{bad", "not JSON"), ("[1]", "a JSON object")])
def test_an_engine_config_that_is_not_a_json_object_names_the_field(value, why):
    with pytest.raises(ValueError, match=rf"transformers_continuous_batching_config .*{why}"):
        PresampleConfig(use_transformers_continuous_batching=True, transformers_continuous_batching_config=value)


# ------------------------------------------------------------------------ options that change nothing ---
@pytest.mark.parametrize("config_cls,options,says", [
    (DPHConfig, dict(divergence="js", divergence_alpha=0.5), "divergence_alpha=0.5 is read only by divergence='alpha'"),
    (EEPOConfig, dict(entropy_gate="always", entropy_window=5), "entropy_window=5 is read only by entropy_gate='auto'"),
    (EEPOConfig, dict(entropy_gate="never", unlearning_lr=0.01, entropy_threshold=0.5),
     "entropy_threshold=0.5 is read only by entropy_gate='auto'.*; unlearning_lr=0.01 does nothing with "
     "entropy_gate='never'"),
    (ERPOConfig, dict(dynamic_sampling_max_rounds=5), "dynamic_sampling_max_rounds=5 does nothing without "
                                                      "dynamic_sampling=True"),
])
def test_an_option_that_would_change_nothing_is_refused_naming_it(config_cls, options, says, tmp_path):
    """ERPO's rule for every config: an option set where what reads it is off would be ignored without a word."""
    with pytest.raises(ValueError, match=says):
        _config(config_cls, tmp_path, **options)
    where_it_acts = {DPHConfig: dict(divergence="alpha", divergence_alpha=0.5),
                     EEPOConfig: dict(entropy_gate="auto", entropy_window=5, unlearning_lr=0.01),
                     ERPOConfig: dict(dynamic_sampling=True, dynamic_sampling_max_rounds=5)}[config_cls]
    _config(config_cls, tmp_path, **where_it_acts)
