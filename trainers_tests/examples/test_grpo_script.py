"""The examples as a drop-in for TRL's ``grpo.py``: every flag of TRL's GRPO script parses
and works or is refused by name before anything loads; QLoRA flags pass TRL's quantization config (or fail clearly
where bitsandbytes cannot run); reward models and dataset mixtures work on the tiny default."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest
import torch
import yaml

from trainers_tests.helpers import (
    DEFAULT_MODEL_PATH,
    TRAINERS,
    small_config,
    tiny_reward_model,
    train_dataset,
)
from trl_variants.data import get_reward_funcs, load_datasets, loading
from trl_variants.default import load_default_dataset
from trl_variants.rewards import REWARD_FUNCS
from trl_variants.training import TrainScriptArguments, parse_args, run_training, trainer_kwargs

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--max_steps", "2", "--embedded_train_size", "16", "--per_device_train_batch_size", "4",
         "--max_completion_length", "8", "--torch_threads", "1", "--logging_steps", "1", "--report_to", "none",
         "--save_strategy", "no"]


def trl_grpo_flags() -> dict[str, str]:
    """``{flag name: dataclass}`` of every option of TRL's own GRPO script (``trl/scripts/grpo.py``'s parser)."""
    from trl import DatasetMixtureConfig, GRPOConfig, ModelConfig
    from trl.scripts.grpo import GRPOScriptArguments

    return {f.name: cls.__name__ for cls in (GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig)
            for f in dataclasses.fields(cls)}


@pytest.fixture
def nothing_loads(monkeypatch):
    """Fail the test if a model or a dataset is loaded (refusals must come first)."""
    import datasets
    import transformers

    def fail(*a, **k):
        pytest.fail("a model or dataset was loaded before the flag was refused")

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoModelForSequenceClassification):
        monkeypatch.setattr(cls, "from_pretrained", fail)
    monkeypatch.setattr(loading, "load_default_dataset", fail)
    monkeypatch.setattr(datasets, "load_dataset", fail)


def kwargs_for(argv, method="erpo"):
    """The trainer keyword arguments ``examples/train_<method>.py`` builds for ``argv`` (tiny YAML defaults)."""
    _, config_cls = TRAINERS[method]
    parsed = parse_args(config_cls, ROOT / "configs" / method / "tiny_cpu.yaml", argv)
    return trainer_kwargs(*parsed)


# ------------------------------------------------------------------------------------------ every flag ---
@pytest.mark.parametrize("method", list(TRAINERS))
def test_every_flag_of_trls_grpo_script_is_an_option_of_the_example(method):
    from trl import ModelConfig

    ours = {f.name for cls in (TrainScriptArguments, TRAINERS[method][1], ModelConfig)
            for f in dataclasses.fields(cls)}
    missing = sorted(set(trl_grpo_flags()) - ours)
    assert not missing, f"examples/train_{method}.py does not accept TRL grpo.py's flags {missing}"


def test_docs_table_names_every_flag_of_trls_grpo_script():
    text = (ROOT / "docs" / "recipes.md").read_text()
    assert "## TRL grpo.py flags" in text
    section = text.split("## TRL grpo.py flags", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`--([a-z0-9_]+)`", section))
    missing = sorted(set(trl_grpo_flags()) - named)
    assert not missing, f"docs/recipes.md 'TRL grpo.py flags' does not name {missing}"


REFUSED = [
    (["--dataset_streaming"], r"--dataset_streaming is not supported"),
    (["--streaming", "--datasets", "some/dataset"], r"--streaming is not supported"),
    (["--datasets", "a/b", "--dataset_name", "c/d"], r"both --datasets .* and --dataset_name 'c/d'"),
    (["--ignore_bias_buffers"], r"--ignore_bias_buffers has no effect in GRPO"),
    (["--use_peft", "--load_in_4bit", "--load_in_8bit"], r"can't use 8 bit and 4 bit precision"),  # ModelConfig's
    (["--load_in_4bit"], r"--load_in_4bit only acts with --use_peft, .*QLoRA"),
    (["--lora_r", "8"], r"--lora_r only acts with --use_peft"),
    (["--use_dora"], r"--use_dora only acts with --use_peft"),
    (["--use_peft", "--bnb_4bit_quant_type", "fp4"], r"--bnb_4bit_quant_type only acts with --load_in_4bit"),
    (["--use_peft", "--use_bnb_nested_quant"], r"--use_bnb_nested_quant only acts with --load_in_4bit"),
    (["--reward_funcs", "no_such_reward"], r"unknown reward function 'no_such_reward'"),
    (["--reward_model_name_or_path", "/no/such/reward_model"], r"--reward_model_name_or_path '/no/such"),
]


@pytest.mark.parametrize(("argv", "match"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_unsupported_or_ignored_flags_are_refused_by_name_before_anything_loads(nothing_loads, argv, match):
    with pytest.raises(ValueError, match=match):
        kwargs_for(argv)


def test_an_unknown_flag_is_refused_by_the_parser():
    """TRL's grpo.py parses with fail_with_unknown_args=False (a typo is silently dropped); ours refuses it."""
    with pytest.raises(ValueError, match="--lora_rank"):
        parse_args(TRAINERS["erpo"][1], ROOT / "configs" / "erpo" / "tiny_cpu.yaml", ["--lora_rank", "8"])


def test_reward_funcs_default_is_accuracy_reward_unless_a_reward_model_scores():
    assert TrainScriptArguments().reward_funcs == ["accuracy_reward"]
    assert TrainScriptArguments(reward_model_name_or_path="org/rm").reward_funcs == []  # as TRL's grpo.py
    assert TrainScriptArguments(reward_model_name_or_path="org/rm",
                                        reward_funcs=["format_reward"]).reward_funcs == ["format_reward"]


def test_trl_registry_reward_names_resolve_to_trl_rewards():
    import trl.rewards

    funcs = get_reward_funcs(["accuracy_reward", "reasoning_accuracy_reward", "think_format_reward",
                                      "get_soft_overlong_punishment"])
    assert funcs[0] is REWARD_FUNCS["accuracy_reward"]  # ours (time-bounded math-verify)
    assert funcs[1] is trl.rewards.reasoning_accuracy_reward and funcs[2] is trl.rewards.think_format_reward
    # TRL's grpo.py registers the punishment with max_completion_len=1280, soft_punish_cache=256
    overlong = funcs[3]
    assert overlong(completion_ids=[[0] * 1024, [0] * 1152, [0] * 1280]) == [0.0, -0.5, -1.0]


# ---------------------------------------------------------------------------------------- QLoRA flags ---
@pytest.mark.parametrize("flag", ["--load_in_4bit", "--load_in_8bit"])
def test_quantization_where_bitsandbytes_cannot_run_fails_before_anything_loads(nothing_loads, flag):
    pytest.importorskip("peft", reason="--use_peft needs peft")
    from transformers.utils import is_bitsandbytes_available

    if is_bitsandbytes_available() and torch.cuda.is_available():
        pytest.skip("bitsandbytes can run on this machine (CUDA): nothing to refuse")
    with pytest.raises(ValueError, match=rf"{flag} quantizes the model with bitsandbytes, which cannot run here .* "
                                         rf"drop {flag}"):
        kwargs_for(["--use_peft", flag])


@pytest.fixture
def bitsandbytes_available(monkeypatch):
    """transformers' own bitsandbytes checks (the ones ``from_pretrained`` runs) pass, as on a CUDA machine."""
    import transformers.integrations
    from transformers.quantizers import quantizer_bnb_4bit, quantizer_bnb_8bit

    for module in (quantizer_bnb_4bit, quantizer_bnb_8bit):
        monkeypatch.setattr(module, "is_bitsandbytes_available", lambda *a, **k: True)
    monkeypatch.setattr(transformers.integrations, "validate_bnb_backend_availability", lambda **k: True)


def test_load_in_4bit_passes_trls_quantization_config_with_every_bnb_option(bitsandbytes_available):
    pytest.importorskip("peft", reason="--use_peft needs peft")
    from peft import LoraConfig
    from transformers import BitsAndBytesConfig

    kwargs = kwargs_for(["--use_peft", "--lora_r", "4", "--load_in_4bit", "--dtype", "bfloat16",
                         "--bnb_4bit_quant_type", "fp4", "--use_bnb_nested_quant", "--bnb_4bit_quant_storage",
                         "uint8"])
    q = kwargs["quantization_config"]
    assert isinstance(q, BitsAndBytesConfig)
    assert (q.load_in_4bit, q.load_in_8bit) == (True, False)
    assert q.bnb_4bit_compute_dtype == torch.bfloat16 and q.bnb_4bit_quant_type == "fp4"
    assert q.bnb_4bit_use_double_quant is True and q.bnb_4bit_quant_storage == torch.uint8
    assert isinstance(kwargs["peft_config"], LoraConfig) and kwargs["peft_config"].r == 4
    assert "quantization_config" not in kwargs["args"].model_init_kwargs  # one place only, as GRPOTrainer requires
    assert kwargs["args"].model_init_kwargs["dtype"] == "bfloat16"


def test_load_in_8bit_passes_trls_quantization_config(bitsandbytes_available):
    pytest.importorskip("peft", reason="--use_peft needs peft")
    q = kwargs_for(["--use_peft", "--load_in_8bit"])["quantization_config"]
    assert (q.load_in_8bit, q.load_in_4bit) == (True, False)


def test_quantization_config_reaches_the_model_load(bitsandbytes_available, monkeypatch, tmp_path):
    """The trainer hands the config to ``from_pretrained`` (stopped there: no bitsandbytes to quantize with)."""
    pytest.importorskip("peft", reason="--use_peft needs peft")
    import trl.trainer.grpo_trainer as grpo_module

    seen = {}

    def stop(model_id, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop before loading")

    monkeypatch.setattr(grpo_module, "create_model_from_path", stop)
    kwargs = kwargs_for(["--use_peft", "--load_in_4bit", "--output_dir", str(tmp_path)], "eepo")
    with pytest.raises(RuntimeError, match="stop before loading"):
        TRAINERS["eepo"][0](**kwargs)
    assert seen["quantization_config"] is kwargs["quantization_config"]


# ------------------------------------------------------------------------------------- dataset mixtures ---
def _write_json_dataset(directory: Path, seed: int, n: int, extra: str) -> Path:
    ds = load_default_dataset(n_train=n, n_test=1, seed=seed)["train"]
    ds = ds.add_column(extra, list(range(n)))  # a column of this dataset only
    directory.mkdir(parents=True)
    ds.to_json(directory / "train.jsonl")
    return directory


def test_mixture_from_yaml_with_fractions_columns_and_test_split(tmp_path):
    a = _write_json_dataset(tmp_path / "a", seed=1, n=12, extra="only_a")
    b = _write_json_dataset(tmp_path / "b", seed=2, n=40, extra="only_b")
    config = yaml.safe_load((ROOT / "configs" / "erpo" / "tiny_cpu.yaml").read_text())
    config.update(datasets=[{"path": str(a), "columns": ["prompt", "solution"], "fraction": 0.25},
                            {"path": str(b), "columns": ["prompt", "solution"], "fraction": 0.75}],
                  test_split_size=0.25, eval_strategy="steps", eval_steps=1, output_dir=str(tmp_path / "out"))
    path = tmp_path / "mixture.yaml"
    path.write_text(yaml.safe_dump(config))
    script_args, training_args, _ = parse_args(TRAINERS["erpo"][1], argv=["--config", str(path)])
    assert [d.fraction for d in script_args.datasets] == [0.25, 0.75]
    train, test = load_datasets(script_args, training_args)
    # TRL's fractions: the largest mixture without oversampling, 12 / 0.25 = 48 rows: 12 of a and 36 of b
    assert len(train) + len(test) == 48 and len(test) == 12
    assert set(train.column_names) == {"prompt", "solution"}
    rows = {(r["prompt"][0]["content"], r["solution"]) for r in [*train, *test]}
    expected = [load_default_dataset(n_train=12, n_test=1, seed=1)["train"],
                load_default_dataset(n_train=40, n_test=1, seed=2)["train"].select(range(36))]
    assert rows == {(r["prompt"][0]["content"], r["solution"]) for ds in expected for r in ds}


def test_mixture_from_the_command_line_concatenates_in_order(tmp_path):
    a = _write_json_dataset(tmp_path / "a", seed=1, n=5, extra="x")
    b = _write_json_dataset(tmp_path / "b", seed=2, n=7, extra="x")
    script_args, training_args, _ = parse_args(
        TRAINERS["eepo"][1], ROOT / "configs" / "eepo" / "tiny_cpu.yaml", ["--datasets", str(a), str(b)])
    train, test = load_datasets(script_args, training_args)
    assert test is None and len(train) == 12
    want = [*load_default_dataset(n_train=5, n_test=1, seed=1)["train"]["solution"],
            *load_default_dataset(n_train=7, n_test=1, seed=2)["train"]["solution"]]
    assert train["solution"] == want and train["x"] == [*range(5), *range(7)]


# --------------------------------------------------------------------------------------- reward models ---
@pytest.fixture(scope="module")
def reward_model_path(tmp_path_factory):
    return tiny_reward_model(tmp_path_factory.mktemp("reward") / "tiny-rm")


def test_offline_reward_model_scores_exactly_as_grpo_trainer(reward_model_path, tmp_path):
    """The offline pass's wrapper gives GRPOTrainer's own rewards for a reward model, bit for bit."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_variants import accuracy_reward
    from trl_variants._offline import callable_reward_funcs

    trainer = GRPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=[reward_model_path, accuracy_reward],
                          args=small_config(GRPOConfig, tmp_path), train_dataset=train_dataset(8))
    rows = list(load_default_dataset(n_train=3, n_test=1, seed=0, with_reference=True)["train"])
    prompts = [r["prompt"] for r in rows]
    completions = [r["completion"] for r in rows[:2]] + [[{"role": "assistant", "content": "\\boxed{-1}"}]]
    ids = [[1, 2, 3]] * 3
    expected = trainer._calculate_rewards(rows, prompts, completions, ids)
    funcs = callable_reward_funcs(trainer, "test")
    assert funcs[0].__name__ == trainer.reward_func_names[0] == "tiny-rm" and funcs[1] is accuracy_reward
    got = [funcs[0](prompts=prompts, completions=completions), expected[:, 1].tolist()]
    assert torch.equal(torch.tensor(got[0]), expected[:, 0])
    assert len(set(got[0])) == 3  # three different texts, three different scores: the test can tell them apart
    from trl_variants.presample.reward_calls import reward_fingerprint

    assert reward_fingerprint(funcs[0]) is None  # its weights are not in the cache key: always re-scored


def test_reward_model_is_refused_in_a_sharded_offline_pass(reward_model_path):
    from types import SimpleNamespace

    from transformers import AutoModelForSequenceClassification

    from trl_variants._offline import callable_reward_funcs

    model = AutoModelForSequenceClassification.from_pretrained(reward_model_path, num_labels=1)
    fake = SimpleNamespace(reward_funcs=[model], reward_processing_classes=[None],
                           chat_template_kwargs={}, is_fsdp_enabled=True, is_deepspeed_enabled=False,
                           accelerator=SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=None)))
    with pytest.raises(ValueError, match="APOTrainer: the offline pass cannot score with a reward model sharded"):
        callable_reward_funcs(fake, "APOTrainer")
    fake.is_fsdp_enabled = False  # DDP / one process: wrapped
    assert callable_reward_funcs(fake, "APOTrainer")[0].model is fake.reward_funcs[0]


def test_reward_model_flag_trains_apo_through_the_example(reward_model_path, tmp_path):
    """``--reward_model_name_or_path`` through the example's own parsing: A*-PO's offline pass scores with the
    reward model (as GRPOTrainer would), then 2 training steps score with it, and the weights change."""
    from safetensors.torch import load_file

    from trl_variants import APOConfig, APOTrainer

    argv = [*QUICK, "--output_dir", str(tmp_path / "out"), "--reward_model_name_or_path", reward_model_path,
            "--num_value_samples", "2", "--check_binary_rewards", "false", "--presample_cache_dir",
            str(tmp_path / "cache"), "--learning_rate", "1e-2"]
    trainer = run_training(APOTrainer, APOConfig, ROOT / "configs" / "apo" / "tiny_cpu.yaml", argv)
    # the model first, then the YAML's reward_funcs (as TRL's grpo.py orders them)
    assert trainer.reward_func_names == ["tiny-rm", "accuracy_reward"]
    assert isinstance(trainer.reward_funcs[0], torch.nn.Module)
    per_func = [v for row in trainer.train_dataset["ref_rewards_per_func"] for v in row]
    model_scores = [v[0] for v in per_func]
    assert all(math.isfinite(v) for v in model_scores) and len(set(model_scores)) > 1
    assert not set(model_scores) <= {0.0, 1.0}  # continuous scores of the model, not a verifier's 0 / 1
    logged = [e for e in trainer.state.log_history if "rewards/tiny-rm/mean" in e]
    assert len(logged) == 2
    before = load_file(Path(DEFAULT_MODEL_PATH) / "model.safetensors")
    after = load_file(tmp_path / "out" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in after if k in before)
