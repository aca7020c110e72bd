import pytest
from transformers import AutoTokenizer

from trl_variants.default import DEFAULT_MODEL_PATH, build_tokenizer, check_character_level
from trl_variants.default.tokenizer import CHARACTERS


def test_built_and_shipped_tokenizers_agree(tiny_tokenizer):
    built = build_tokenizer()
    text = "Tom has 51 pens.\n51 + 22 = 73. \\boxed{73}"
    assert built(text)["input_ids"] == tiny_tokenizer(text)["input_ids"]
    assert len(tiny_tokenizer) == 100


def test_round_trip_every_character(tiny_tokenizer):
    ids = tiny_tokenizer(CHARACTERS, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(CHARACTERS)  # one token per character, newline included
    assert tiny_tokenizer.decode(ids) == CHARACTERS
    check_character_level(tiny_tokenizer)


def test_special_tokens_and_padding(tiny_tokenizer):
    assert tiny_tokenizer.eos_token == "<|im_end|>" and tiny_tokenizer.pad_token == "<|endoftext|>"
    assert tiny_tokenizer.padding_side == "left"
    batch = tiny_tokenizer(["ab", "abcd"], padding=True)["input_ids"]
    assert batch[0][:2] == [tiny_tokenizer.pad_token_id] * 2


def test_chat_template(tiny_tokenizer):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "What is 1 + 2?"}]
    text = tiny_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n"
    ids = tiny_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)
    assert tiny_tokenizer.decode(ids["input_ids"]) == text


def test_autotokenizer_loads_character_level_class():
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    assert tok("\n2", add_special_tokens=False)["input_ids"] == [99, 58]


def test_check_character_level_rejects_other_tokenizers():
    class Fake:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [1]}

    with pytest.raises(RuntimeError, match="processing_class"):
        check_character_level(Fake())
