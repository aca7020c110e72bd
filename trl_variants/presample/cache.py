"""The pass's on-disk cache: the key (what a result depends on), atomic shard files, and where they live."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch

from .config import PresampleConfig
from .reward_calls import reward_name


def _model_fingerprint(model) -> str:
    """Identity of the model's weights: name, and a hash of a sample of every parameter tensor."""
    h = hashlib.sha256(str(getattr(model.config, "_name_or_path", "")).encode())
    with torch.no_grad():
        for name, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 64)][:64].float().cpu()
            h.update(name.encode())
            h.update(sample.numpy().tobytes())
            h.update(str(float(p.detach().float().sum())).encode())
    return h.hexdigest()[:16]


def _tokenizer_fingerprint(tokenizer) -> str:
    probe = "\n".join(["What is 4 + 7?", "<|im_start|>", "\\boxed{1}", "  x"])
    h = hashlib.sha256(json.dumps([tokenizer(probe)["input_ids"], str(getattr(tokenizer, "chat_template", "")),
                                   tokenizer.pad_token_id, tokenizer.eos_token_id]).encode())
    return h.hexdigest()[:16]


def cache_key(model, tokenizer, dataset, config: PresampleConfig, reward_funcs=(), reward_weights=()) -> str:
    """Key of a pass: model weights, tokenizer, dataset fingerprint, reward functions and result options."""
    payload = {
        "model": _model_fingerprint(model),
        "tokenizer": _tokenizer_fingerprint(tokenizer),
        "dataset": getattr(dataset, "_fingerprint", None) or hashlib.sha256(
            json.dumps(dataset.to_dict(), default=str).encode()).hexdigest(),
        "rows": len(dataset),
        "rewards": [f"{getattr(f, '__module__', '')}.{reward_name(f)}" for f in reward_funcs],
        "reward_weights": list(map(float, reward_weights)),
        "options": config.key_options(),
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
