"""The pass's on-disk cache: the key (what a result depends on), atomic shard files, and where they live."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch

from .._card import public_name
from .._model import is_peft_model
from .config import PresampleConfig
from .reward_calls import reward_fingerprint, reward_name


def _model_fingerprint(model) -> str:
    """Identity of the model: its full config and generation config (an edited ``rope_theta`` is another model),
    and a hash of a sample of every parameter tensor plus its sum (fine-tuned weights are another model). An
    ``eos_token_id`` of one id counts the same as a list of that id: transformers up to 5.17 turns the policy's
    ``eos_token_id`` into a list when ``train()`` starts (``align_special_tokens``), which made A*-PO's lazy stage 1
    resample, on a resume, shards it had sampled from the policy before its first update."""
    h = hashlib.sha256(str(getattr(model.config, "_name_or_path", "")).encode())
    h.update(model.config.to_json_string(use_diff=False).encode())
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        eos = generation_config.eos_token_id
        if isinstance(eos, list) and len(eos) == 1:  # [2] stops where 2 does: one key for both forms
            generation_config = copy.deepcopy(generation_config)
            generation_config.eos_token_id = eos[0]
        h.update(generation_config.to_json_string(use_diff=False).encode())
    with torch.no_grad():
        for name, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 64)][:64].float().cpu()
            h.update(name.encode())
            h.update(sample.numpy().tobytes())
            h.update(str(float(p.detach().float().sum())).encode())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------------------- the model a dataset was made by ---
# A presampled dataset records which weights made it (:func:`model_signature`); a trainer compares it with its own
# model (``metadata.check_presample_model``). The same weights loaded in another dtype are the same model: from_pretrained
# casts with round-to-nearest, so both sides cast to the coarser of the two dtypes are bit-identical.
_SIGNATURE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _reference_weights(model):
    """The tensors that define the model's function before training, in definition order. Under PEFT: the base
    model's own weights (the adapters, and the trainable copies of ``modules_to_save``, left out; they start as
    no-ops), so a PEFT trainer compares the base model a presampled dataset was made with."""
    if not is_peft_model(model):
        return [p for _, p in model.named_parameters()]
    adapters = set(model.peft_config)
    return [p for name, p in model.get_base_model().named_parameters() if not adapters & set(name.split("."))]


def _weights_dtype(params) -> str | None:
    """The dtype most of the floating-point weights have, as a name in :data:`_SIGNATURE_DTYPES` (float64 counts as
    float32); None when a weight is not floating point (a quantized model: its stored values are not the weights)."""
    counts: dict[str, int] = {}
    for p in params:
        if not p.is_floating_point() or p.dtype.itemsize == 1:  # int / packed 4-bit / float8 storage
            return None
        name = {torch.float64: "float32"}.get(p.dtype, str(p.dtype).removeprefix("torch."))
        counts[name] = counts.get(name, 0) + p.numel()
    best = max(counts, key=counts.get) if counts else None
    return best if best in _SIGNATURE_DTYPES else None


def signature_dtype(a: str, b: str) -> str:
    """The dtype in which two copies of the same weights, held in dtypes ``a`` and ``b``, are bit-identical: the
    coarser one (float32 vs bfloat16 -> bfloat16); bfloat16 vs float16 compare in bfloat16 (exact when the weights
    were stored in either of them, as most checkpoints are)."""
    if a == b:
        return a
    return b if a == "float32" else a if b == "float32" else "bfloat16"


def model_signature(model, dtypes=tuple(_SIGNATURE_DTYPES), gather=None) -> dict:
    """Which weights a model holds, robust to the dtype it was loaded in: per dtype in ``dtypes``, a hash of every
    weight's shape and of 64 evenly spaced values cast to that dtype (a fine-tuned or another model differs in
    them; the name or path and the config do not enter: a path moves, a config gains keys between transformers
    versions). ``dtype`` is the weights' own; ``name`` is for messages only (a local path by its last part). ``gather(p)``, when given, is a context
    in which ``p`` holds its full value (DeepSpeed ZeRO-3)."""
    from contextlib import nullcontext

    params = _reference_weights(model)
    own = _weights_dtype(params)
    # published with the dataset (every row's ref_presample_info): a local path by its last part (_card)
    record = {"name": public_name(str(getattr(model.config, "_name_or_path", "") or type(model).__name__)),
              "dtype": own,
              "hashes": {}}
    if own is None or not dtypes:
        return record
    hashes = {d: hashlib.sha256() for d in dtypes}
    with torch.no_grad():
        for p in params:
            with gather(p) if gather else nullcontext():
                shape, flat = str(tuple(p.shape)).encode(), p.detach().reshape(-1)
                sample = flat[:: max(1, flat.numel() // 64)][:64].cpu()
            for d, h in hashes.items():
                h.update(shape)
                h.update(sample.to(_SIGNATURE_DTYPES[d]).float().numpy().tobytes())
    record["hashes"] = {d: h.hexdigest()[:16] for d, h in hashes.items()}
    return record


def _tokenizer_fingerprint(tokenizer) -> str:
    """The whole tokenizer (vocabulary, merges, normalisation) when it is a fast one, its chat template and special
    tokens (decoding the completions depends on all of them)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    probe = "\n".join(["What is 4 + 7?", "<|im_start|>", "\\boxed{1}", "  x"])
    body = backend.to_str() if backend is not None else json.dumps(tokenizer(probe)["input_ids"])
    h = hashlib.sha256(body.encode())
    h.update(json.dumps([str(getattr(tokenizer, "chat_template", "")), tokenizer.pad_token_id,
                         tokenizer.eos_token_id, tokenizer.bos_token_id]).encode())
    return h.hexdigest()[:16]


def _library_versions() -> dict:
    from importlib import metadata

    return {pkg: metadata.version(pkg) for pkg in ("torch", "transformers", "trl-variants")}


def cache_key(model, tokenizer, dataset, config: PresampleConfig, reward_funcs=(), reward_weights=(), *,
              prompt_ids=None, backend: str = "hf") -> str:
    """Key of a pass: everything its result depends on. The model (config and weights), the tokenizer, the exact
    prompt token ids (chat template and its arguments included), the other dataset columns (rewards read them),
    each reward function's fingerprint (:func:`reward_fingerprint`; one that cannot be fingerprinted is keyed by
    name and re-scored on every call), the reward weights, every result option (the computation layout included),
    the backend that generates, and the versions of the libraries that generate and score."""
    payload = {
        "model": _model_fingerprint(model),
        "tokenizer": _tokenizer_fingerprint(tokenizer),
        "prompt_ids": None if prompt_ids is None else hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest(),
        "dataset": getattr(dataset, "_fingerprint", None) or hashlib.sha256(
            json.dumps(dataset.to_dict(), default=str).encode()).hexdigest(),
        "rows": len(dataset),
        "rewards": [reward_fingerprint(f) or f"rescored:{reward_name(f)}" for f in reward_funcs],
        "reward_weights": list(map(float, reward_weights)),
        "options": config.key_options(),
        "backend": backend,
        "versions": _library_versions(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:20]


def default_cache_dir() -> Path:
    return Path(os.environ.get("TRL_VARIANTS_CACHE", Path.home() / ".cache" / "trl_variants" / "presample"))


def atomic_write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic: a reader sees the old file or the whole new one, never half of it
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_shard(path: Path, expected_rows: int):
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and len(data.get("rows", [])) == expected_rows else None
