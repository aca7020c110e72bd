"""Validated inputs: a wrong input is refused with a message naming the field, column,
rows or path and the fix, before the model loads (the ``no_model_load`` fixture makes any load fail the test)."""

from __future__ import annotations

import glob
import shutil
import warnings

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer, PreTrainedModel

from trainers_tests.helpers import TRAINERS as ALL_TRAINERS
from trainers_tests.helpers import small_config
from trl_variants import (
    DEFAULT_MODEL_PATH,
    APOConfig,
    APOTrainer,
    ComposedConfig,
    ComposedTrainer,
    DPHConfig,
    DPHTrainer,
    EEPOConfig,
    EEPOTrainer,
    ERPOConfig,
    ERPOTrainer,
    accuracy_reward,
)
from trl_variants._validation import check_model_reference
from trl_variants.presample import PresampleConfig, presample

TRAINERS = list(ALL_TRAINERS.values())
IDS = list(ALL_TRAINERS)
PROMPTS = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "What is 4 + 1?"}]]


class ModelLoaded(Exception):
    pass


@pytest.fixture
def no_model_load(monkeypatch):
    def fail(cls, *args, **kwargs):
        raise ModelLoaded(f"{cls.__name__}.from_pretrained was called before the input was refused")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(fail))


def _config(config_cls, tmp_path, **kw):
    # A*-PO: one completion per prompt, a batch of 2 prompts (as many as the datasets here hold)
    batch = 2 if config_cls is APOConfig else 4
    kw = {"per_device_train_batch_size": batch, "num_generations": 2, "max_steps": 1, **kw}
    if config_cls is APOConfig:
        kw["num_generations"] = 1
    return small_config(config_cls, tmp_path, **kw)


def _prompts(*prompts, **columns):
    return Dataset.from_dict({"prompt": list(prompts), "solution": ["5"] * len(prompts), **columns})


# ------------------------------------------------------------------------------- item 8: config time ---
@pytest.mark.parametrize("config_cls", [c for _, c in TRAINERS], ids=IDS)
@pytest.mark.parametrize("field,value,fix", [
    ("temperature", 0.0, "small value"), ("temperature", float("nan"), "small value"),
    ("max_completion_length", 0, "new tokens"), ("learning_rate", -1e-6, "1e-6"), ("top_p", 0.0, "1.0"),
    ("num_iterations", 0, "optimization pass"), ("epsilon", -0.2, "clipping range"),
])
def test_config_rejects_values_that_fail_later(config_cls, field, value, fix, tmp_path):
    with pytest.raises(ValueError, match=rf"{config_cls.__name__}\.{field} must be .*{fix}"):
        _config(config_cls, tmp_path, **{field: value})


@pytest.mark.parametrize("config_cls", [c for _, c in TRAINERS], ids=IDS)
def test_config_accepts_sane_values(config_cls, tmp_path):
    config = _config(config_cls, tmp_path, temperature=0.01, learning_rate=0.0, top_p=1.0, top_k=0)
    assert config.temperature == 0.01


# ------------------------------------------------------------------------------- item 8: model paths ---
def test_model_reference_local_typo_names_the_path(tmp_path):
    typo = str(tmp_path / "erpo-tny")
    with pytest.raises(ValueError, match=r"--models '.*erpo-tny' does not exist.*check the spelling"):
        check_model_reference(typo, "--models")


def test_model_reference_relative_typo_under_existing_dir(tmp_path, monkeypatch):
    (tmp_path / "outputs").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"'outputs/run-typo' does not exist"):
        check_model_reference("outputs/run-typo", "--model_name_or_path")


def test_model_reference_hub_id_offline_not_cached(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match=r"'no-such-org/no-such-model' is not a local directory.*HF_HUB_OFFLINE"):
        check_model_reference("no-such-org/no-such-model", "--base_model")


def test_model_reference_directory_without_model(tmp_path):
    with pytest.raises(ValueError, match=r"without config.json.*save_model"):
        check_model_reference(str(tmp_path), "--reference_model")


def test_model_reference_accepts_the_default():
    check_model_reference(DEFAULT_MODEL_PATH, "--model_name_or_path")
    check_model_reference(None, "--base_model")


def test_evaluate_cli_checks_every_model_before_evaluating(tmp_path, monkeypatch, no_model_load):
    from trl_variants.cli import evaluate_command

    def no_eval(*args, **kwargs):
        raise ModelLoaded("an evaluation started before all model paths were checked")

    monkeypatch.setattr("trl_variants.evaluation.evaluate", no_eval)
    monkeypatch.setattr(evaluate_command, "load_eval_dataset", no_eval)
    argv = ["--base_model", DEFAULT_MODEL_PATH, "--models", DEFAULT_MODEL_PATH, str(tmp_path / "typo"),
            "--output_dir", str(tmp_path / "eval")]
    with pytest.raises(ValueError, match=r"--models '.*typo' does not exist"):
        evaluate_command.evaluate_main(argv)
    with pytest.raises(ValueError, match=r"--reference_model '.*nope' does not exist"):
        evaluate_command.evaluate_main(argv[:4] + ["--reference_model", str(tmp_path / "nope")])


def test_presample_cli_checks_the_model_path(tmp_path, monkeypatch, no_model_load):
    from trl_variants.cli import presample_command

    def no_data(*args, **kwargs):
        raise ModelLoaded("the dataset was loaded before the model path was checked")

    monkeypatch.setattr(presample_command, "load_datasets", no_data)
    with pytest.raises(ValueError, match=r"--model_name_or_path '\./typo-model' does not exist"):
        presample_command.presample_main(["--model_name_or_path", "./typo-model", "--output_dir", str(tmp_path / "out")])


def test_training_script_checks_the_model_path(tmp_path, monkeypatch, no_model_load):
    from trl_variants.training import run

    def no_data(*args, **kwargs):
        raise ModelLoaded("the dataset was loaded before the model path was checked")

    monkeypatch.setattr(run, "load_datasets", no_data)
    argv = ["--model_name_or_path", "./typo-model", "--output_dir", str(tmp_path), "--use_cpu", "true",
            "--report_to", "none", "--max_steps", "1"]
    with pytest.raises(ValueError, match=r"--model_name_or_path '\./typo-model' does not exist"):
        run.run_training(ERPOTrainer, ERPOConfig, None, argv=argv)


# ------------------------------------------------------------------------------ item 9: the datasets ---
@pytest.mark.parametrize("trainer_cls,config_cls", TRAINERS, ids=IDS)
def test_missing_prompt_column_refused_before_model_load(trainer_cls, config_cls, tmp_path, no_model_load):
    data = Dataset.from_dict({"question": ["What is 2 + 3?"] * 4, "solution": ["5"] * 4})
    with pytest.raises(ValueError, match=rf"{trainer_cls.__name__}: the train_dataset has no 'prompt' column.*"
                                         r"\['question', 'solution'\].*rename_column"):
        trainer_cls(DEFAULT_MODEL_PATH, accuracy_reward, args=_config(config_cls, tmp_path), train_dataset=data)


@pytest.mark.parametrize("trainer_cls,config_cls", TRAINERS, ids=IDS)
def test_empty_training_set_refused_before_model_load(trainer_cls, config_cls, tmp_path, no_model_load):
    """An empty training set trained 0 steps and an example saved the untouched base."""
    data = _prompts("What is 2 + 3?").select([])
    with pytest.raises(ValueError, match=rf"{trainer_cls.__name__}: the train_dataset has no rows.*filter"):
        trainer_cls(DEFAULT_MODEL_PATH, accuracy_reward, args=_config(config_cls, tmp_path), train_dataset=data)


@pytest.mark.parametrize("trainer_cls,config_cls", TRAINERS, ids=IDS)
def test_fewer_prompts_than_one_rollout_batch_refused_before_model_load(trainer_cls, config_cls, tmp_path,
                                                                        no_model_load):
    """TRL's sampler makes only whole rollout batches: with fewer prompts it made none, and training ended at step 0
    with a warning, saving the untouched model (a paper recipe's smoke command on 2 processes did)."""
    args = _config(config_cls, tmp_path, steps_per_generation=2)
    per_device, G = args.per_device_train_batch_size, args.num_generations
    prompts = per_device * 2 // G  # one process
    data = _prompts(*[f"What is {i} + 3?" for i in range(prompts - 1)])
    with pytest.raises(ValueError, match=rf"{trainer_cls.__name__}: the train_dataset has {prompts - 1} prompts, "
                                         rf"fewer than one rollout batch: per_device_train_batch_size {per_device} x 1 "
                                         rf"process\(es\) x steps_per_generation 2 = {2 * per_device} completions = "
                                         rf"{prompts} prompts x num_generations {G}\..* 0 steps.*--dataset_train_split"):
        trainer_cls(DEFAULT_MODEL_PATH, accuracy_reward, args=args, train_dataset=data)


def test_a_dataset_left_smaller_than_one_rollout_batch_is_refused_when_training_starts(tmp_path):
    """The backstop for a dataset that shrank after the checks before the model load (an offline pass keeps only
    some prompts: DPH-RL's D_exp, A*-PO's valued ones): the training dataloader is refused, not run for 0 steps."""
    from trainers_tests.helpers import small_trainer

    trainer = small_trainer("erpo", tmp_path, dataset=_prompts("What is 2 + 3?", "What is 4 + 1?"),
                            per_device_train_batch_size=4, num_generations=2)  # 2 prompts: one rollout batch
    trainer.get_train_dataloader()
    trainer.train_dataset = trainer.train_dataset.select([0])
    with pytest.raises(ValueError, match=r"ERPOTrainer: the train_dataset has 1 prompt to train on, fewer than one "
                                         r"rollout batch.*= 2 prompts x num_generations 2"):
        trainer.get_train_dataloader()


@pytest.mark.parametrize("trainer_cls,config_cls", TRAINERS, ids=IDS)
def test_a_stream_smaller_than_one_rollout_batch_is_an_error_not_a_run_of_0_steps(trainer_cls, config_cls, tmp_path):
    """A stream's length is unknown before it is read: one prompt against a rollout batch of 2 made no batch, and
    transformers ended training at step 0 with a warning (an example then saved the untouched model)."""
    from datasets import IterableDataset

    args = _config(config_cls, tmp_path, max_steps=2)
    prompts = args.generation_batch_size // args.num_generations
    data = IterableDataset.from_generator(lambda: iter([{"prompt": "What is 2 + 3?", "solution": "5"}] * (prompts - 1)))
    if trainer_cls.__name__ == "DPHTrainer":  # its offline pass reads the stream whole, and refuses it there
        with pytest.raises(ValueError, match=r"D_exp has 1 prompts, fewer than one generation batch.*0 steps"):
            trainer_cls(DEFAULT_MODEL_PATH, accuracy_reward, args=args, train_dataset=data)
        return
    trainer = trainer_cls(DEFAULT_MODEL_PATH, accuracy_reward, args=args, train_dataset=data)
    with pytest.raises(ValueError, match=rf"{trainer_cls.__name__}: training ran 0 steps \(from step 0 to max_steps "
                                         rf"2\): the train_dataset gave no whole rollout batch of {prompts} prompts.*"
                                         r"a stream's length is unknown.*The model was not trained"):
        trainer.train()


@pytest.mark.parametrize("trainer_cls,config_cls", TRAINERS, ids=IDS)
@pytest.mark.parametrize("empty,why", [
    ("", "empty string"), ("   ", "empty string"), ([], "no message"),
    ([{"role": "user", "content": ""}], "only empty message contents"),
])
def test_empty_prompts_refused_before_model_load(trainer_cls, config_cls, empty, why, tmp_path, no_model_load):
    if isinstance(empty, str):
        data = _prompts("What is 2 + 3?", empty, "What is 4 + 1?", empty)
    else:
        data = _prompts(PROMPTS[0], empty, PROMPTS[1], empty)
    with pytest.raises(ValueError, match=rf"{trainer_cls.__name__}: .*{why} at rows \[1, 3\] \(2 in all\).*filter"):
        trainer_cls(DEFAULT_MODEL_PATH, accuracy_reward, args=_config(config_cls, tmp_path), train_dataset=data)


def test_prompt_of_wrong_type_refused(tmp_path, no_model_load):
    data = Dataset.from_dict({"prompt": [None, "What is 2 + 3?"], "solution": ["5", "5"]})
    with pytest.raises(ValueError, match=r"type NoneType at rows \[0\]"):
        EEPOTrainer(DEFAULT_MODEL_PATH, accuracy_reward, args=_config(EEPOConfig, tmp_path), train_dataset=data)


def test_none_solution_refused_at_dataset_load(tmp_path):
    from trl_variants.data import load_datasets
    from trl_variants.training import TrainScriptArguments

    path = tmp_path / "data"
    Dataset.from_dict({"prompt": ["What is 2 + 3?"] * 3, "solution": ["5", None, None]}).save_to_disk(str(path))
    with pytest.raises(ValueError, match=r"'solution' is None at rows \[1, 2\] \(2 in all\).*--solution_column"):
        load_datasets(TrainScriptArguments(dataset_name=str(path)))
    # a format-only run does not read the gold answer
    train, _ = load_datasets(TrainScriptArguments(dataset_name=str(path), reward_funcs=["format_reward"]))
    assert len(train) == 3


# ------------------------------------------------------------------- item 6: presampled for another trainer ---
def test_dph_refuses_data_presampled_without_completion_logps(tmp_path, no_model_load):
    data = _prompts(*PROMPTS, ref_prompt_logp=[-3.0, -4.0], ref_rewards=[[1.0], [0.0]])
    with pytest.raises(ValueError, match=r"DPHTrainer: the train_dataset was presampled.*lacks \['ref_completion_ids', "
                                         r"'ref_completion_logps', 'ref_prompt_ids'\].*--record_completion_logps true"):
        DPHTrainer(DEFAULT_MODEL_PATH, accuracy_reward, args=_config(DPHConfig, tmp_path), train_dataset=data)


def test_apo_refuses_data_presampled_without_values(tmp_path, no_model_load):
    data = _prompts(*PROMPTS, ref_prompt_ids=[[1, 2], [1, 3]], ref_rewards=[[1.0], [0.0]])
    with pytest.raises(ValueError, match=r"APOTrainer: the train_dataset was presampled.*lacks \['ref_value'\].*"
                                         r"--value_beta 0\.5"):
        APOTrainer(DEFAULT_MODEL_PATH, accuracy_reward, args=_config(APOConfig, tmp_path, value_beta=0.5),
                   train_dataset=data)


# --------------------------------------------------------------------------- item 3: ERPO's column ---
def test_erpo_refuses_nan_reference_prompt_logp(tmp_path, tiny_model, tiny_tokenizer):
    data = _prompts(*PROMPTS, PROMPTS[0], PROMPTS[1], ref_prompt_logp=[-3.0, float("nan"), -2.0, None])
    with pytest.raises(ValueError, match=r"'ref_prompt_logp' must hold finite numbers; rows \[1, 3\].*drop the column"):
        ERPOTrainer(tiny_model, accuracy_reward, args=_config(ERPOConfig, tmp_path), train_dataset=data,
                    processing_class=tiny_tokenizer)


# ------------------------------------------------------------------------------ item 7: no pad token ---
@pytest.fixture
def no_pad_tokenizer():
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH, padding_side="left")
    tok.pad_token = None
    assert tok.pad_token_id is None
    return tok


def _logp_config(tmp_path, **kw):
    return PresampleConfig(num_samples=0, record_prompt_logp=True, cache_dir=str(tmp_path / "cache"),
                           show_progress=False, **kw)


def test_presample_without_pad_token_falls_back_to_eos(tmp_path, tiny_model, no_pad_tokenizer):
    out = presample(tiny_model, no_pad_tokenizer, _prompts(*PROMPTS), [], _logp_config(tmp_path, use_cache=False))
    assert no_pad_tokenizer.pad_token == no_pad_tokenizer.eos_token
    assert all(torch.isfinite(torch.tensor(out["ref_prompt_logp"])))


def test_presample_from_path_without_pad_token(tmp_path, no_pad_tokenizer):
    model_dir = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL_PATH, model_dir)
    no_pad_tokenizer.save_pretrained(model_dir)
    assert AutoTokenizer.from_pretrained(model_dir).pad_token is None
    out = presample(str(model_dir), None, _prompts(*PROMPTS), [], _logp_config(tmp_path, use_cache=False))
    assert len(out["ref_prompt_logp"]) == 2


def test_evaluate_without_pad_token(tiny_model, no_pad_tokenizer):
    from trl_variants.evaluate import EvalConfig, evaluate

    config = EvalConfig(k=2, temperatures=[1.0], greedy=False, max_completion_length=4, compute_entropy=False)
    result = evaluate(tiny_model, no_pad_tokenizer, _prompts(*PROMPTS), [accuracy_reward], config)
    assert result["num_prompts"] == 2


# -------------------------------------------------------------------------- item 9: damaged cache ---
def test_damaged_presample_cache_is_recomputed(tmp_path, tiny_model, tiny_tokenizer):
    data, config = _prompts(*PROMPTS), _logp_config(tmp_path)
    first = presample(tiny_model, tiny_tokenizer, data, [], config)
    arrows = glob.glob(str(tmp_path / "cache" / "*" / "dataset" / "*.arrow"))
    assert len(arrows) == 1
    with open(arrows[0], "r+b") as f:
        f.truncate(f.seek(0, 2) // 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = presample(tiny_model, tiny_tokenizer, data, [], config)
    messages = [str(w.message) for w in caught if "damaged" in str(w.message)]
    assert messages and "dataset" in messages[0] and "recomputing" in messages[0], messages
    assert again["ref_prompt_logp"] == first["ref_prompt_logp"]
    third = presample(tiny_model, tiny_tokenizer, data, [], config)  # the rewritten cache entry is sound
    assert third["ref_prompt_logp"] == first["ref_prompt_logp"]


# ------------------------------------------------------------------ reward functions' columns, before the load ---
def answer_reward(completions, answer, **kwargs):  # needs a dataset column "answer"
    return [float(a in c[0]["content"]) for a, c in zip(answer, completions, strict=True)]


@pytest.mark.parametrize("trainer_cls,config_cls", TRAINERS, ids=IDS)
def test_reward_function_columns_are_checked_before_the_model_loads(trainer_cls, config_cls, tmp_path, no_model_load):
    """A reward function that needs a column the dataset lacks: refused naming the function and the column, before
    the model loads (GRPOTrainer fails at the first reward call, after loading and generating)."""
    with pytest.raises(ValueError, match=rf"{trainer_cls.__name__}: reward function 'answer_reward' needs the dataset "
                                         r"column 'answer'.*\(columns: \['prompt', 'solution'\]\)"):
        trainer_cls(model=DEFAULT_MODEL_PATH, reward_funcs=[accuracy_reward, answer_reward],
                    args=_config(config_cls, tmp_path), train_dataset=_prompts(*PROMPTS))
    with pytest.raises(ModelLoaded):  # with the column, the same call goes on to load the model
        trainer_cls(model=DEFAULT_MODEL_PATH, reward_funcs=[accuracy_reward, answer_reward],
                    args=_config(config_cls, tmp_path), train_dataset=_prompts(*PROMPTS, answer=["5", "5"]))


# --------------------------------------------------------------- inputs checked by rule: every trainer, the pass ---
# The rule holds for ComposedTrainer too (its default parts: ERPO's two and DPH-RL's rehearsal).
RULE_TRAINERS = TRAINERS + [(ComposedTrainer, ComposedConfig)]
RULE_IDS = IDS + ["composed"]


def answer_or_none_reward(completions, answer=None, **kwargs):  # reads "answer" when there is one
    return [0.0 if a is None else float(a in c[0]["content"]) for a, c in zip(answer or [None] * len(completions),
                                                                            completions, strict=True)]


def kwargs_reward(completions, **kwargs):  # every extra column arrives as a kwarg; it requires none
    return [float(kwargs.get("answer") is not None)] * len(completions)


@pytest.mark.parametrize("trainer_cls,config_cls", RULE_TRAINERS, ids=RULE_IDS)
def test_reward_column_holding_none_refused_before_model_load(trainer_cls, config_cls, tmp_path, no_model_load):
    """A column a reward function requires (no default) that is None in some rows: refused naming the trainer, the
    function, the column, the rows and the fix (the function would get None in its list; accuracy_reward scores the
    text 'None'). A function with a default for it, or only **kwargs, is not refused."""
    data = _prompts(*PROMPTS, *PROMPTS, answer=["5", None, "5", None])
    with pytest.raises(ValueError, match=rf"{trainer_cls.__name__}: reward function 'answer_reward' requires the "
                                         r"dataset column 'answer', which is None at rows \[1, 3\] \(2 in all\).*"
                                         r"filter"):
        trainer_cls(DEFAULT_MODEL_PATH, [accuracy_reward, answer_reward], args=_config(config_cls, tmp_path),
                    train_dataset=data)
    # DPH-RL is told which of two rewards without accuracy_reward decides correctness (else refused, before the load)
    which = {"correctness_reward": "answer_or_none_reward"} if config_cls in (DPHConfig, ComposedConfig) else {}
    with pytest.raises(ModelLoaded):  # not required (a default, or **kwargs): accepted
        trainer_cls(DEFAULT_MODEL_PATH, [answer_or_none_reward, kwargs_reward],
                    args=_config(config_cls, tmp_path, **which), train_dataset=data)


@pytest.mark.parametrize("trainer_cls,config_cls", RULE_TRAINERS, ids=RULE_IDS)
def test_prompt_message_without_role_refused_before_model_load(trainer_cls, config_cls, tmp_path, no_model_load):
    """A conversation with a message that has no role (None once stored: a dataset column holds one schema): the
    chat template fails at the first batch, after the model load ("'dict object' has no attribute 'role'")."""
    bad = [{"role": "system", "content": "Answer briefly."}, {"content": "What is 2 + 3?"}]
    data = Dataset.from_dict({"prompt": [PROMPTS[0], bad, PROMPTS[1], bad], "solution": ["5"] * 4})
    with pytest.raises(ValueError, match=rf"{trainer_cls.__name__}: the train_dataset's 'prompt' column has unusable "
                                         r"prompts \(a message without a role at rows \[1, 3\] \(2 in all\)\).*"
                                         r"filter"):
        trainer_cls(DEFAULT_MODEL_PATH, accuracy_reward, args=_config(config_cls, tmp_path), train_dataset=data)


@pytest.mark.parametrize("trainer_cls,config_cls", RULE_TRAINERS, ids=RULE_IDS)
def test_prompt_of_wrong_type_refused_by_every_trainer(trainer_cls, config_cls, tmp_path, no_model_load):
    data = Dataset.from_dict({"prompt": [None, "What is 2 + 3?", None], "solution": ["5"] * 3})
    with pytest.raises(ValueError, match=rf"{trainer_cls.__name__}: .*type NoneType at rows \[0, 2\].*filter"):
        trainer_cls(DEFAULT_MODEL_PATH, accuracy_reward, args=_config(config_cls, tmp_path), train_dataset=data)


def test_presample_refuses_a_reward_column_holding_none(tmp_path, no_model_load):
    data = _prompts(*PROMPTS, answer=["5", None])
    config = PresampleConfig(num_samples=1, cache_dir=str(tmp_path / "cache"), show_progress=False)
    with pytest.raises(ValueError, match=r"presample: reward function 'answer_reward' requires the dataset column "
                                         r"'answer', which is None at rows \[1\] \(1 in all\)"):
        presample(DEFAULT_MODEL_PATH, None, data, [answer_reward], config)
    with pytest.raises(ModelLoaded):  # no sample, no reward call: the column is not read
        presample(DEFAULT_MODEL_PATH, None, data, [answer_reward], _logp_config(tmp_path))


def test_streamed_dataset_is_not_read_by_the_checks(tmp_path, no_model_load):
    """A stream's rows are not read before training (they would be consumed): only its known columns are checked."""
    data = _prompts(*PROMPTS, answer=["5", None]).to_iterable_dataset()
    with pytest.raises(ModelLoaded):
        ERPOTrainer(DEFAULT_MODEL_PATH, [answer_reward], args=_config(ERPOConfig, tmp_path), train_dataset=data)


# ------------------------------------------------- stored values that cannot be true, refused before the model loads ---
def _presampled_for_dph(**overrides):
    """Two prompts as `trl-variants presample --num_samples 2 --record_completion_logps true` leaves them (values made
    up; the checks read only their shape and range), with ``overrides`` replacing columns."""
    columns = dict(ref_prompt_ids=[[1, 2], [1, 3]], ref_completion_ids=[[[5, 6, 2], [7, 2]], [[5, 2], [6, 6, 6, 2]]],
                   ref_completion_logps=[[[-0.5, -1.0, -0.1], [-2.0, -0.3]], [[-0.2, -0.1], [-1.0, -1.0, -1.0, -0.5]]],
                   ref_rewards=[[1.0, 0.0], [0.0, 0.0]], ref_rewards_per_func=[[[1.0], [0.0]], [[0.0], [0.0]]])
    return _prompts(*PROMPTS, **{**columns, **overrides})


STORED_CASES = {  # trainer -> (the dataset, what the message says); EEPO reads no stored column
    "erpo": (lambda: _prompts(*PROMPTS, ref_prompt_logp=[-3.0, 2.5]),
             r"column 'ref_prompt_logp' holds l_ref\(s\), a sum of log-probs \(<= 0\), but rows \[1\] \(1 in all\) are "
             r"above 0 \(e\.g\. row 1: 2\.5\).*drop the column.*--record_prompt_logp true"),
    "dph": (lambda: _presampled_for_dph(ref_completion_logps=[[[-0.5, -1.0, -0.1], [-2.0, -0.3]],
                                                              [[-0.2, -0.1], [-1.0, -1.0, -0.5]]]),
            r"column 'ref_completion_logps' has, at rows \[1\] \(1 in all\), a completion with another number of "
            r"log-probs than its tokens in 'ref_completion_ids' \(e\.g\. row 1, completion 1: 3 log-probs for 4 "
            r"tokens\).*--record_completion_logps true.*drop the ref_\* columns"),
    "apo": (lambda: _prompts(*PROMPTS, ref_prompt_ids=[[1, 2], [1, 3]], ref_rewards=[[1.0, 0.0], [0.0, 0.0]],
                             ref_value=[0.4, 3.0]),
            r"column 'ref_value' holds V_hat\(x\), a soft maximum of the row's 'ref_rewards' \(between their smallest "
            r"and largest; NaN when none is finite\), but rows \[1\] \(1 in all\) do not \(e\.g\. row 1: 3\.0 for rewards \[0\.0, 0\.0\]\).*"
            r"--value_beta.*drop the ref_\* columns"),
}


def _stored_case(trainer_cls):
    name = {ERPOTrainer: "erpo", DPHTrainer: "dph", APOTrainer: "apo", ComposedTrainer: "erpo"}[trainer_cls]
    return STORED_CASES[name]


@pytest.mark.parametrize("trainer_cls,config_cls", [t for t in RULE_TRAINERS if t[0] is not EEPOTrainer],
                         ids=[i for i in RULE_IDS if i != "eepo"])
def test_stored_value_that_cannot_be_true_refused_before_model_load(trainer_cls, config_cls, tmp_path,
                                                                    no_model_load):
    """A stored column the trainer reads holding a value the offline pass cannot have made: ERPO's l_ref(s) above 0
    (a sum of log-probs), DPH-RL's per-token reference log-probs not one per completion token (the loss pads the
    missing ones with log-prob 0, silently), A*-PO's V_hat outside its rewards' range."""
    make, message = _stored_case(trainer_cls)
    kw = {"parts": ["erpo_query_weights", "erpo_query_kl"]} if trainer_cls is ComposedTrainer else {}  # ERPO's
    with pytest.raises(ValueError, match=rf"{trainer_cls.__name__}: {message}"):
        trainer_cls(DEFAULT_MODEL_PATH, accuracy_reward, args=_config(config_cls, tmp_path, **kw), train_dataset=make())


def test_composed_rehearsal_checks_the_stored_completion_logps(tmp_path, no_model_load):
    make, message = STORED_CASES["dph"]
    args = _config(ComposedConfig, tmp_path, parts=["dph_rehearsal"])
    with pytest.raises(ValueError, match=rf"ComposedTrainer: {message}"):
        ComposedTrainer(DEFAULT_MODEL_PATH, accuracy_reward, args=args, train_dataset=make())


@pytest.mark.parametrize("overrides,message", [
    (dict(ref_completion_logps=[[[-0.5, 0.7, -0.1], [-2.0, -0.3]], [[-0.2, -0.1], [-1.0, -1.0, -1.0, -0.5]]]),
     r"'ref_completion_logps' holds per-token log-probs \(<= 0, finite\), but rows \[0\] \(1 in all\) do not "
     r"\(e\.g\. row 0: 0\.7\)"),
    (dict(ref_completion_logps=[[[-0.5, -1.0, -0.1]], [[-0.2, -0.1], [-1.0, -1.0, -1.0, -0.5]]]),
     r"'ref_completion_logps' has, at rows \[0\] \(1 in all\), another number of completions than "
     r"'ref_completion_ids' \(e\.g\. row 0: 1 and 2\)"),
])
def test_dph_refuses_other_impossible_completion_logps(overrides, message, tmp_path, no_model_load):
    with pytest.raises(ValueError, match=rf"DPHTrainer: .*{message}"):
        DPHTrainer(DEFAULT_MODEL_PATH, accuracy_reward, args=_config(DPHConfig, tmp_path),
                   train_dataset=_presampled_for_dph(**overrides))


@pytest.mark.parametrize("values,shown", [([0.4, float("inf")], "inf"), ([0.4, None], "None")])
def test_apo_refuses_a_value_that_is_not_a_number(values, shown, tmp_path, no_model_load):
    data = _prompts(*PROMPTS, ref_prompt_ids=[[1, 2], [1, 3]], ref_rewards=[[1.0, 0.0], [0.0, 1.0]], ref_value=values)
    with pytest.raises(ValueError, match=rf"APOTrainer: column 'ref_value' .*rows \[1\] .*row 1: {shown}"):
        APOTrainer(DEFAULT_MODEL_PATH, accuracy_reward, args=_config(APOConfig, tmp_path), train_dataset=data)


@pytest.mark.parametrize("trainer_cls,config_cls", RULE_TRAINERS, ids=RULE_IDS)
def test_possible_stored_values_are_accepted(trainer_cls, config_cls, tmp_path, no_model_load):
    """What the offline pass makes is not refused (a NaN V_hat: no sample got a reward; an l_ref of 0); EEPO reads no
    stored column, so it refuses none of these."""
    if trainer_cls in (DPHTrainer, ComposedTrainer):
        data = _presampled_for_dph()
        if trainer_cls is ComposedTrainer:
            data = data.add_column("ref_prompt_logp", [-3.0, 0.0])
    elif trainer_cls is APOTrainer:
        data = _prompts(*PROMPTS, ref_prompt_ids=[[1, 2], [1, 3]], ref_rewards=[[1.0, 0.0], [float("nan")] * 2],
                        ref_value=[0.4, float("nan")])
    else:
        data = _prompts(*PROMPTS, ref_prompt_logp=[-3.0, 0.0])
        if trainer_cls is EEPOTrainer:
            data = _presampled_for_dph(ref_completion_logps=[[[0.5]], [[1.0]]]).add_column("ref_prompt_logp",
                                                                                          [2.0, 1.0])
    with pytest.raises(ModelLoaded):
        trainer_cls(DEFAULT_MODEL_PATH, accuracy_reward, args=_config(config_cls, tmp_path), train_dataset=data)


# ------------------------------------------------------------ a model that does not exist, before anything loads ---
@pytest.mark.parametrize("trainer_cls,config_cls", RULE_TRAINERS, ids=RULE_IDS)
def test_model_path_that_does_not_exist_refused_by_every_trainer(trainer_cls, config_cls, tmp_path, no_model_load):
    typo = str(tmp_path / "erpo-tny")
    with pytest.raises(ValueError, match=rf"{trainer_cls.__name__}: model '.*erpo-tny' does not exist.*check the "
                                         r"spelling.*HF_HUB_OFFLINE is set"):
        trainer_cls(typo, accuracy_reward, args=_config(config_cls, tmp_path), train_dataset=_prompts(*PROMPTS))
    with pytest.raises(ValueError, match=rf"{trainer_cls.__name__}: model 'no-such-org/no-such-model' is not a local "
                                         r"directory and not in the Hugging Face cache, and HF_HUB_OFFLINE is set"):
        trainer_cls("no-such-org/no-such-model", accuracy_reward, args=_config(config_cls, tmp_path),
                    train_dataset=_prompts(*PROMPTS))
    with pytest.raises(ValueError, match=rf"{trainer_cls.__name__}: reward_funcs\[1\] 'no-such-org/reward-model' is "
                                         r"not a local directory"):
        trainer_cls(DEFAULT_MODEL_PATH, [accuracy_reward, "no-such-org/reward-model"],
                    args=_config(config_cls, tmp_path), train_dataset=_prompts(*PROMPTS))


def test_presample_refuses_a_model_path_that_does_not_exist(tmp_path, no_model_load):
    with pytest.raises(ValueError, match=r"presample: model '.*erpo-tny' does not exist.*HF_HUB_OFFLINE is set"):
        presample(str(tmp_path / "erpo-tny"), None, _prompts(*PROMPTS), [], _logp_config(tmp_path))


def test_the_offline_pass_output_passes_the_stored_checks(tmp_path, tiny_model, tiny_tokenizer):
    """What presample() writes (temperature 0.7: the log-probs of the scaled distribution) is never refused."""
    from trl_variants.presample.stored import check_stored_columns

    config = PresampleConfig(num_samples=2, max_completion_length=6, temperature=0.7, record_prompt_logp=True,
                             record_completion_logps=True, value_beta=0.5, use_cache=False, show_progress=False)
    out = presample(tiny_model, tiny_tokenizer, _prompts(*PROMPTS), [accuracy_reward], config)
    check_stored_columns(out, "test", None, ["ref_prompt_logp", "ref_completion_logps", "ref_value"])
    check_stored_columns(out.select([1]), "test", None, ["ref_prompt_logp", "ref_completion_logps", "ref_value"])


def test_stored_columns_of_an_eval_dataset_are_checked_as_the_training_set_s(tmp_path):
    """An eval dataset's stored l_ref(s) above 0 is refused as the train_dataset's would be (it used to be checked for
    finiteness only)."""
    bad = _prompts(*PROMPTS, ref_prompt_logp=[-3.0, 2.0])
    with pytest.raises(ValueError, match=r"ERPOTrainer: column 'ref_prompt_logp' holds l_ref\(s\), a sum of log-probs "
                                         r"\(<= 0\), but rows \[1\] \(1 in all\) are above 0"):
        ERPOTrainer(DEFAULT_MODEL_PATH, accuracy_reward, args=_config(ERPOConfig, tmp_path),
                    train_dataset=_prompts(*PROMPTS, *PROMPTS), eval_dataset=bad)


def test_stored_columns_that_passed_are_not_read_again(monkeypatch):
    """A trainer checks its training set at construction and again where the offline pass reads it: the second
    check of the same content reads nothing; a transformed dataset (another fingerprint) is read, and a failing one
    fails every time."""
    from trl_variants.presample import stored

    reads = []
    real = stored.check_finite_column
    monkeypatch.setattr(stored, "check_finite_column", lambda *a, **k: (reads.append(1), real(*a, **k))[1])
    good = _prompts(*PROMPTS, ref_prompt_logp=[-3.0, -1.0])
    stored.check_stored_columns(good, "t", None, ["ref_prompt_logp"])
    stored.check_stored_columns(good, "t", None, ["ref_prompt_logp"])
    assert len(reads) == 1
    stored.check_stored_columns(good.select([0]), "t", None, ["ref_prompt_logp"])
    assert len(reads) == 2
    bad = _prompts(*PROMPTS, ref_prompt_logp=[-3.0, 2.0])
    for _ in range(2):
        with pytest.raises(ValueError, match="are above 0"):
            stored.check_stored_columns(bad, "t", None, ["ref_prompt_logp"])
