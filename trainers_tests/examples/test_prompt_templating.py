"""Prompt templating and the prompt-length filter of the example scripts (docs/recipes.md gaps 2
and 3): a system prompt, re-templating a string ``prompt`` column (DAPO's stored text), plain-text prompts without
the chat template, dropping prompts over N tokens; and the DPH-RL / A*-PO recipes that use them."""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets import Dataset
from transformers import AutoTokenizer

from trainers_tests.helpers import DEFAULT_MODEL_PATH
from trl_variants.data import load_datasets, prepare_columns
from trl_variants.generation import tokenize_prompts
from trl_variants.training import TrainScriptArguments, parse_args, trainer_kwargs

ROOT = Path(__file__).resolve().parents[2]
BOXED = "Please reason step by step, and put your final answer within \\boxed{}."
# DAPO-17K's stored prompt text (open-r1/DAPO-Math-17k-Processed `prompt` = the source chat's user message)
DAPO = ("Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{}\n\nRemember to put your "
        "answer on its own line after \"Answer:\".")


def _args(**kw) -> TrainScriptArguments:
    return TrainScriptArguments(**kw)


def _ds(prompts, **columns):
    return Dataset.from_dict({"prompt": prompts, "solution": ["1"] * len(prompts), **columns})


def _recipe_args(path: str):
    """The script arguments of a paper recipe as its example parses them (bf16 faked, as test_configs does)."""
    import transformers.training_args

    from trainers_tests.examples.test_configs import parse_recipe

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
        return parse_recipe(ROOT / path)[0]


def test_auto_keeps_the_old_behaviour():
    """A string `prompt` column with no templating option stays plain text; any other column becomes one user
    message with the suffix (as before these options existed)."""
    ds = _ds(["What is 1+0?"], problem=["What is 2-1?"])
    assert prepare_columns(ds, _args(), "d")["prompt"] == ["What is 1+0?"]
    wrapped = prepare_columns(ds, _args(prompt_column="problem", prompt_suffix=" Go."), "d")
    assert wrapped["prompt"] == [[{"role": "user", "content": "What is 2-1? Go."}]]


def test_string_prompt_column_retemplated_with_system_prompt_and_regex():
    """DPH-RL's recipe on DAPO's text: the wrapper is cut off, the problem becomes the user message after the
    paper's system prompt (App. I.2)."""
    problem = "Find $x$ if\n\n$2x = 4$."  # a blank line inside the problem survives (DOTALL, lazy group)
    args = _recipe_args("configs/dph/qwen2.5-math-7b.yaml")
    assert (args.prompt_column, args.prompt_format, args.system_prompt) == ("prompt", "chat", BOXED)
    out = prepare_columns(_ds([DAPO.format(problem), DAPO.format("1+1?")]), args, "dapo")
    assert out["prompt"] == [[{"role": "system", "content": BOXED}, {"role": "user", "content": problem}],
                             [{"role": "system", "content": BOXED}, {"role": "user", "content": "1+1?"}]]
    assert "Answer:" not in str(out["prompt"])


def test_regex_that_misses_a_row_is_an_error():
    args = _args(prompt_regex=r"Q: (.*)")
    assert prepare_columns(_ds(["Q: 2+2"]), args, "d")["prompt"] == [[{"role": "user", "content": "2+2"}]]
    with pytest.raises(ValueError, match=r"--prompt_regex does not match 1 of 2 rows .* row 1"):
        prepare_columns(_ds(["Q: 2+2", "2+3"]), args, "d")


def test_plain_format_feeds_text_without_the_chat_template():
    """A*-PO's `add_prompt_template: False`: the prompt stays a string, which GRPOTrainer tokenizes as plain text
    (``processing_class(text=prompts)``: no chat template) and the offline passes too (tokenize_prompts)."""
    args = _recipe_args("configs/apo/qwen2.5-7B.yaml")
    assert (args.prompt_format, args.filter_prompt_length) == ("plain", 256)
    out = prepare_columns(_ds(["x"], problem=["What is 2+2?"]), args, "math")
    text = "What is 2+2? Let's think step by step and output the final answer within \\boxed{}."
    assert out["prompt"] == [text]
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    plain = tokenize_prompts(tok, out["prompt"])[0]
    assert plain == tok(text=text)["input_ids"]
    chat = tokenize_prompts(tok, [[{"role": "user", "content": text}]])[0]
    assert len(chat) > len(plain)  # the chat template adds its role markers


def test_conversational_column_gets_the_system_prompt_once():
    chats = [[{"role": "user", "content": "a"}], [{"role": "system", "content": "own"}, {"role": "user", "content": "b"}]]
    out = prepare_columns(_ds(chats), _args(system_prompt="S"), "d")
    assert out["prompt"] == [[{"role": "system", "content": "S"}, {"role": "user", "content": "a"}], chats[1]]
    with pytest.raises(ValueError, match="already conversational"):
        prepare_columns(_ds(chats), _args(prompt_suffix=" more"), "d")


@pytest.mark.parametrize(("kw", "match"), [
    (dict(prompt_format="plain", system_prompt="S"), "--system_prompt needs a conversational prompt"),
    (dict(prompt_regex="no group"), "exactly one capture group"),
    (dict(prompt_regex="(unclosed"), "not a valid regular expression"),
    (dict(prompt_format="jinja"), "--prompt_format must be"),
    (dict(filter_prompt_length=0), "--filter_prompt_length must be >= 1"),
])
def test_bad_templating_flags_are_refused_at_parse_time(kw, match):
    with pytest.raises(ValueError, match=match):
        _args(**kw)


def test_filter_prompt_length_drops_and_counts(tmp_path, capsys):
    """Hand-countable: with the tiny tokenizer, the limit is set between the lengths of the prompts, so exactly the
    longer ones go; the count is printed; the end-to-end path (trainer_kwargs) loads the model's tokenizer."""
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    prompts = ["1+1?", "What is 2+2? " * 3, "What is 3+3? " * 30, "4?"]
    Dataset.from_dict({"problem": prompts, "solution": ["2", "4", "6", "4"]}).save_to_disk(str(tmp_path / "d"))
    lengths = [len(tokenize_prompts(tok, [[{"role": "user", "content": p}]])[0]) for p in prompts]
    limit = lengths[1]  # keeps 0, 1 and 3
    assert lengths[0] <= limit and lengths[3] <= limit < lengths[2]
    argv = ["--dataset_name", str(tmp_path / "d"), "--prompt_column", "problem", "--filter_prompt_length",
            str(limit), "--output_dir", str(tmp_path / "out"), "--report_to", "none", "--use_cpu", "true"]
    from trl_variants import ERPOConfig

    script_args, training_args, model_args = parse_args(ERPOConfig, argv=argv)
    kwargs = trainer_kwargs(script_args, training_args, model_args)
    assert [p[0]["content"] for p in kwargs["train_dataset"]["prompt"]] == [prompts[0], prompts[1], prompts[3]]
    assert f"dropped 1 of 4 train prompts longer than {limit} tokens, 3 left" in capsys.readouterr().out
    script_args.filter_prompt_length = min(lengths) - 1
    with pytest.raises(ValueError, match="left no train prompts"):
        load_datasets(script_args, training_args, tok)
    with pytest.raises(ValueError, match="--filter_prompt_length counts prompt tokens with the model's tokenizer"):
        load_datasets(script_args, training_args)  # a caller that forgot the tokenizer
