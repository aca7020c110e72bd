"""What a presampled dataset records about how it was made, the checks a trainer runs against it, and a summary."""

from __future__ import annotations

import json

from .config import METADATA_KEY, PresampleConfig


def with_metadata(dataset, config: PresampleConfig, key: str):
    info = dataset.info
    info.description = json.dumps({METADATA_KEY: {"options": config.key_options(), "cache_key": key}})
    return dataset


def presample_options(dataset) -> dict | None:
    """The :class:`PresampleConfig` options a presampled dataset was made with (None for other datasets)."""
    try:
        return json.loads(dataset.info.description or "")[METADATA_KEY]["options"]
    except (ValueError, KeyError, TypeError):
        return None


def check_presample_options(dataset, **expected) -> None:
    """Raise when a presampled dataset was made with options other than ``expected`` (e.g. a trainer's N, beta1 or
    temperature), naming the option, both values and the fix."""
    options = presample_options(dataset)
    if options is None:
        return
    for name, want in expected.items():
        have = options.get(name)
        if want is not None and have != want:
            raise ValueError(f"the presampled dataset was made with {name}={have!r} but the trainer is configured "
                             f"with {want!r}: set the trainer's value to {have!r} or presample again with {want!r}")


def summarize(dataset) -> dict[str, float]:
    """Mean reward, fraction of prompts whose samples are all correct / all wrong, and (if present) mean V_hat."""
    if "ref_rewards" not in dataset.column_names:
        return {}
    rewards = dataset["ref_rewards"]
    flat = [r for rs in rewards for r in rs]
    out = {
        "mean_reward": sum(flat) / len(flat),
        "frac_all_correct": sum(all(r > 0 for r in rs) for rs in rewards) / len(rewards),
        "frac_all_wrong": sum(all(r <= 0 for r in rs) for rs in rewards) / len(rewards),
    }
    if "ref_value" in dataset.column_names:
        out["mean_value"] = sum(dataset["ref_value"]) / len(dataset)
    return out
