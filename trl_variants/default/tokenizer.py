"""Character-level tokenizer of the embedded default model, built offline with the ``tokenizers`` library.

100 tokens: 3 special tokens (``<|endoftext|>`` = pad, ``<|im_start|>``, ``<|im_end|>`` = eos), ``<unk>`` and the
96 printable ASCII characters plus newline; one token per character. The chat template is Qwen-style (ChatML), so
TRL formats prompts for it exactly as for Qwen models.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN, BOS_TURN_TOKEN, EOS_TOKEN, UNK_TOKEN = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"
CHARACTERS = string.ascii_letters + string.digits + string.punctuation + " \n"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MODEL_MAX_LENGTH = 256


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer (deterministic; no files or network)."""
    specials = [PAD_TOKEN, BOS_TURN_TOKEN, EOS_TOKEN, UNK_TOKEN]
    vocab = {tok: i for i, tok in enumerate(specials + list(CHARACTERS))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([PAD_TOKEN, BOS_TURN_TOKEN, EOS_TOKEN])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[BOS_TURN_TOKEN],
        chat_template=CHAT_TEMPLATE,
        model_max_length=MODEL_MAX_LENGTH,
        padding_side="left",
    )


def check_character_level(tokenizer) -> None:
    """Raise if ``tokenizer`` is not the character-level one (guards against transformers swapping in a
    byte-level tokenizer for some model types, which silently drops newlines)."""
    ids = tokenizer("\n2", add_special_tokens=False)["input_ids"]
    if len(ids) != 2:
        raise RuntimeError(
            f"the embedded tokenizer encoded '\\n2' as {ids}, not two tokens: transformers loaded a different "
            "tokenizer class. Load it with PreTrainedTokenizerFast.from_pretrained(path) and pass it as "
            "processing_class."
        )
