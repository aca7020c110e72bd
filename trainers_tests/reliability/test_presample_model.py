"""A presampled dataset records which weights made it, and ERPO, DPH-RL and A*-PO refuse one made by another model
(it was used silently as the reference), before the first forward; the same weights in another
dtype, or under PEFT, are accepted."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from trl_variants import DEFAULT_MODEL_PATH, accuracy_reward
from trl_variants.presample import PresampleConfig, presample
from trl_variants.presample.cache import model_signature, signature_dtype
from trl_variants.presample.config import METADATA_COLUMN, METADATA_KEY
from trl_variants.presample.metadata import presample_metadata

from ..helpers import SMALL_METHOD_ARGS, TRAINERS, small_config, train_dataset

PRESAMPLED = ["erpo", "dph", "apo"]  # the trainers that read presampled reference columns


def _pass_config(method, tmp_path) -> PresampleConfig:
    """The options the trainers of :func:`_trainer` check a presampled dataset against."""
    common = dict(temperature=1.0, max_completion_length=8, cache_dir=str(tmp_path / "presample"),
                  show_progress=False)
    if method == "erpo":
        return PresampleConfig(num_samples=0, record_prompt_logp=True, **common)
    if method == "dph":
        return PresampleConfig(num_samples=2, record_prompt_logp=False, record_completion_logps=True, **common)
    return PresampleConfig(num_samples=2, value_beta=0.5, record_prompt_logp=False, **common)


def _presampled(method, model, tokenizer, tmp_path):
    return presample(model, tokenizer, train_dataset(4), accuracy_reward, _pass_config(method, tmp_path))


def _trainer(method, model, data, tmp_path, **kw):
    trainer_cls, config_cls = TRAINERS[method]
    batch = {"per_device_train_batch_size": 4} if method == "apo" else {}  # one rollout batch: the 4 prompts
    args = small_config(config_cls, tmp_path / "out", max_completion_length=8, **SMALL_METHOD_ARGS[method], **batch)
    return trainer_cls(model=model, reward_funcs=accuracy_reward, args=args, train_dataset=data, **kw)


def _other_model():
    """The tiny default with one weight matrix changed by 1%: another model under the same name."""
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH, dtype=torch.float32)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1.01)
    return model


@pytest.fixture
def no_forward(monkeypatch):
    """``no_forward()``: from then on any forward of the tiny model's class fails the test (the check must come
    before the first one). Called once the presampled dataset is made."""
    def fail(self, *args, **kwargs):
        raise AssertionError("a model forward ran before the presampled dataset was checked")

    model_cls = type(AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH))
    return lambda: monkeypatch.setattr(model_cls, "forward", fail)


LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")


# --------------------------------------------------------------------------------------- the signature ---
def test_signature_ignores_dtype_and_peft_but_not_weights(tiny_model):
    fp32 = model_signature(tiny_model)
    assert fp32["dtype"] == "float32" and set(fp32["hashes"]) == {"float32", "bfloat16", "float16"}
    for dtype, name in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
        cast = model_signature(AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH, dtype=dtype))
        assert cast["dtype"] == name and signature_dtype("float32", name) == name
        assert cast["hashes"][name] == fp32["hashes"][name]  # same weights, compared in the coarser dtype
        assert cast["hashes"]["float32"] != fp32["hashes"]["float32"]  # (rounding is visible at full precision)
    peft = model_signature(get_peft_model(AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH), LORA))
    assert peft["hashes"] == fp32["hashes"]  # the base weights, adapters left out
    other = model_signature(_other_model())
    assert all(other["hashes"][d] != fp32["hashes"][d] for d in fp32["hashes"])
    assert signature_dtype("bfloat16", "float16") == "bfloat16" and signature_dtype("float32", "float32") == "float32"


def test_presampled_dataset_records_its_model(tmp_path, tiny_model, tiny_tokenizer):
    data = _presampled("erpo", tiny_model, tiny_tokenizer, tmp_path)
    record = presample_metadata(data)["model"]
    # the shipped model's name, not its path: every row is published with a pushed dataset
    assert record == model_signature(tiny_model) and record["name"] == "tiny"
    assert json.loads(data[0][METADATA_COLUMN])["model"] == record  # also in the column (survives a Hub round trip)
    assert str(DEFAULT_MODEL_PATH) not in data[0][METADATA_COLUMN]


# ------------------------------------------------------------------------------------------ the trainers ---
@pytest.mark.parametrize("method", PRESAMPLED)
def test_trainers_refuse_data_presampled_by_another_model(method, tmp_path, tiny_model, tiny_tokenizer, no_forward):
    data = _presampled(method, _other_model(), tiny_tokenizer, tmp_path)
    name = TRAINERS[method][0].__name__
    no_forward()
    with pytest.raises(ValueError, match=rf"{name}: the presampled dataset was made by another model: "
                                         rf"'tiny' \(float32\) made it, this trainer trains "
                                         rf"'{DEFAULT_MODEL_PATH}' \(float32\), and their weights differ \(same name.*"
                                         r"Presample again with this model.*or train the model that made it"):
        _trainer(method, tiny_model, data, tmp_path)


@pytest.mark.parametrize("method", PRESAMPLED)
def test_trainers_accept_the_same_weights_in_another_dtype(method, tmp_path, tiny_tokenizer, no_forward):
    """Presampled in bfloat16 (e.g. on a GPU node), trained from the float32 checkpoint."""
    bf16 = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH, dtype=torch.bfloat16)
    data = _presampled(method, bf16, tiny_tokenizer, tmp_path)
    assert presample_metadata(data)["model"]["dtype"] == "bfloat16"
    no_forward()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _trainer(method, DEFAULT_MODEL_PATH, data, tmp_path)
    assert trainer.model.dtype == torch.float32
    assert not [w for w in caught if "presampled dataset" in str(w.message)]  # not even a warning


@pytest.mark.parametrize("method", ["dph", "apo"])
def test_peft_compares_the_base_model(method, tmp_path, tiny_model, tiny_tokenizer, no_forward):
    same = _presampled(method, tiny_model, tiny_tokenizer, tmp_path / "same")
    other = _presampled(method, _other_model(), tiny_tokenizer, tmp_path / "other")
    no_forward()
    _trainer(method, DEFAULT_MODEL_PATH, same, tmp_path / "a", peft_config=LORA)
    with pytest.raises(ValueError, match="made by another model"):
        _trainer(method, DEFAULT_MODEL_PATH, other, tmp_path / "b", peft_config=LORA)


def test_dataset_without_the_record_warns(tmp_path, tiny_model, tiny_tokenizer):
    data = _presampled("erpo", tiny_model, tiny_tokenizer, tmp_path)
    metadata = presample_metadata(data)
    del metadata["model"]
    data = data.remove_columns(METADATA_COLUMN).add_column(METADATA_COLUMN, [json.dumps(metadata)] * len(data))
    data.info.description = json.dumps({METADATA_KEY: metadata})
    with pytest.warns(UserWarning, match=r"ERPOTrainer: the presampled dataset cannot be checked against the model "
                                         r"being trained \(it does not record which model made it\)"):
        _trainer("erpo", tiny_model, data, tmp_path)
