"""What a presampled dataset records about how it was made, the checks a trainer runs against it, and a summary."""

from __future__ import annotations

import json
import math
import warnings

from .._card import public_name
from .cache import model_signature, signature_dtype
from .config import METADATA_COLUMN, METADATA_KEY, PresampleConfig


def with_metadata(dataset, config: PresampleConfig, key: str, reward_funcs: list[str] = (), model=None):
    """Record the options, the reward functions' names (the column order of ``ref_rewards_per_func``) and which
    weights made the dataset (``model``: :func:`~trl_variants.presample.cache.model_signature`) where
    :func:`presample_metadata` reads them back: in the dataset's info (with the cache key), and in the column
    ``ref_presample_info`` (one JSON string per row), which survives a Hub round trip or a Parquet export (the
    info's description does not)."""
    record = {"options": config.key_options(), "reward_funcs": list(reward_funcs)}
    if model is not None:
        record["model"] = model_signature(model)
    if METADATA_COLUMN in dataset.column_names:
        dataset = dataset.remove_columns(METADATA_COLUMN)
    dataset = dataset.add_column(METADATA_COLUMN, [json.dumps(record, sort_keys=True)] * len(dataset))
    dataset.info.description = json.dumps({METADATA_KEY: {**record, "cache_key": key}})
    return dataset


def presample_metadata(dataset) -> dict | None:
    """Everything :func:`with_metadata` recorded (None for datasets not made by the pass)."""
    try:
        return json.loads(dataset.info.description or "")[METADATA_KEY]
    except (ValueError, KeyError, TypeError):
        pass
    if METADATA_COLUMN in dataset.column_names and len(dataset):
        return json.loads(dataset[0][METADATA_COLUMN])
    return None


def presample_options(dataset) -> dict | None:
    """The :class:`PresampleConfig` options a presampled dataset was made with (None for other datasets)."""
    metadata = presample_metadata(dataset)
    return None if metadata is None else metadata["options"]


def check_presample_options(dataset, **expected) -> None:
    """Raise when a presampled dataset was made with options other than ``expected`` (e.g. a trainer's N, beta1 or
    temperature), naming the option, both values and the fix."""
    options = presample_options(dataset)
    if options is None:
        warnings.warn("the dataset has reference columns but no record of how they were made (no "
                      f"'{METADATA_COLUMN}' column): their options ({', '.join(expected)}) and the model that made "
                      "them cannot be checked against the trainer's. Make it with `trl-variants presample` to have "
                      "them checked", stacklevel=3)
        return
    for name, want in expected.items():
        have = options.get(name, "<not recorded>")
        if have != want:
            raise ValueError(f"the presampled dataset was made with {name}={have!r} but the trainer is configured "
                             f"with {want!r}: set the trainer's value to {have!r} or presample again with {want!r}")


def check_presample_model(dataset, model, who: str, gather=None) -> None:
    """Refuse a presampled dataset made by other weights than ``model``'s (its reference columns would be another
    model's), naming both models and the fix. Compared with :func:`~trl_variants.presample.cache.model_signature`
    in the coarser of the two dtypes, so the same weights loaded in bfloat16 for one and float32 for the other match;
    under PEFT the base model's weights are compared. A dataset without the record is not refused: nothing recorded
    at all was warned about by :func:`check_presample_options`; a record without the model (an older trl-variants, a
    quantized model on either side) is warned about here."""
    metadata = presample_metadata(dataset)
    if metadata is None:
        return
    record = metadata.get("model") or {}
    mine = model_signature(model, dtypes=())  # the weights' dtype only
    if not record.get("hashes") or mine["dtype"] is None:
        why = "it does not record which model made it" if not record.get("hashes") else "this model is quantized"
        warnings.warn(f"{who}: the presampled dataset cannot be checked against the model being trained ({why}): "
                      "make sure it was presampled with the same model", stacklevel=3)
        return
    dtype = signature_dtype(record["dtype"], mine["dtype"])
    if model_signature(model, dtypes=(dtype,), gather=gather)["hashes"][dtype] == record["hashes"].get(dtype):
        return
    # the record names a local model by its last part (it is published with the data); the message, by its path
    mine["name"] = str(getattr(model.config, "_name_or_path", "") or type(model).__name__)
    same_name = " (same name, other weights: e.g. a checkpoint saved over it, or weights edited in memory)" \
        if record["name"] in (mine["name"], public_name(mine["name"])) else ""
    raise ValueError(
        f"{who}: the presampled dataset was made by another model: {record['name']!r} ({record['dtype']}) made it, "
        f"this trainer trains {mine['name']!r} ({mine['dtype']}), and their weights differ{same_name}. Its reference "
        "columns would be that other model's. Presample again with this model (`trl-variants presample "
        f"--model_name_or_path {mine['name']} ...`, or pass the prompts without the presample columns and the trainer "
        f"runs the pass itself), or train the model that made it (model={record['name']!r})")


CORRECT_AT = 1.0
"""The one rule for "correct" in the offline pass's statistics and filters: a reference sample is correct when its
reward (the weighted sum over the reward functions) is at least this, the value of a right answer under a binary
{0, 1} accuracy reward. A sample without a reward (NaN) is never correct (the statistics leave it out). A trainer may set its own threshold
(``APOConfig.correctness_threshold``; DPH-RL decides with one named reward, ``correctness_reward``)."""


def is_correct(reward: float, threshold: float = CORRECT_AT) -> bool:
    return not math.isnan(reward) and reward >= threshold


def summarize(dataset, threshold: float = CORRECT_AT) -> dict[str, float]:
    """Mean reward, fraction of prompts whose samples are all correct / all wrong (:func:`is_correct`), and (if
    present) mean V_hat."""
    if "ref_rewards" not in dataset.column_names:
        return {}
    rewards = [[r for r in rs if not math.isnan(r)] for rs in dataset["ref_rewards"]]  # NaN: no reward
    flat = [r for rs in rewards for r in rs]
    out = {
        "mean_reward": sum(flat) / max(1, len(flat)),
        "frac_all_correct": sum(bool(rs) and all(is_correct(r, threshold) for r in rs) for rs in rewards)
        / len(rewards),
        "frac_all_wrong": sum(not any(is_correct(r, threshold) for r in rs) for rs in rewards) / len(rewards),
    }
    if "ref_value" in dataset.column_names:
        values = [v for v in dataset["ref_value"] if not math.isnan(v)]
        out["mean_value"] = sum(values) / max(1, len(values))
    return out
