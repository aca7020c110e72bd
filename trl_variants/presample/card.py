"""The Hub dataset card of a presampled dataset."""

from __future__ import annotations

from .config import COLUMNS
from .metadata import presample_metadata, summarize

CARD_MARKER = "<!-- trl-variants presample dataset card -->"
"""First line of the card's body: tells a README this tool wrote from one a person wrote (``trl-variants presample
--push_to_hub`` replaces the former and refuses to replace the latter without ``--hub_overwrite_card``)."""


def _source_lines(source: dict | None) -> list[str]:
    if not source:
        return ["- source dataset: not recorded (pass `source=` to `dataset_card`)"]
    labels = {"dataset": "source dataset", "config": "dataset config", "split": "split"}
    lines = [f"- {labels.get(k, k)}: `{v}`" for k, v in source.items() if v is not None and v != ""]
    return lines or ["- source dataset: not recorded"]


# which trainer reads a presampled dataset as its offline pass, what of it, and the columns it needs
_CONSUMERS = (
    ("APOTrainer", "A*-PO's stage 1 (N samples, V_hat)", ("ref_value",)),
    ("DPHTrainer", "DPH-RL's pass (k samples, the reward split, per-token reference log-probs)",
     ("ref_rewards", "ref_completion_ids", "ref_completion_logps", "ref_prompt_ids")),
    ("ERPOTrainer", "ERPO's reference prompt log-likelihoods", ("ref_prompt_logp",)),
)


def dataset_card(dataset, model_id: str, dataset_id: str | None = None, source: dict | None = None) -> str:
    """A Hub dataset card (README.md) for a presampled dataset: where it comes from (``source``: ``dataset``,
    ``config``, ``split`` and any other ``name: value`` that selected the prompts), the reference model, the reward
    functions and options recorded in its metadata, the columns, the summary, and the trainers that can read it
    (those whose columns it holds) with their papers' citations."""
    from .._citations import APO, DPH, ERPO

    citations = {"APOTrainer": APO, "DPHTrainer": DPH, "ERPOTrainer": ERPO}
    readers = [(name, what) for name, what, needs in _CONSUMERS if set(needs) <= set(dataset.column_names)]
    made = "; ".join(what for _, what in readers) or "no trainer's offline pass (its columns are incomplete)"
    use = (f"Pass it to {' or '.join(f'`{n}`' for n, _ in readers)} as `train_dataset` and no sampling runs "
           "before training." if readers else "")

    metadata = presample_metadata(dataset) or {}
    options = metadata.get("options") or {}
    reward_funcs = metadata.get("reward_funcs") or []
    rewards = (", ".join(f"`{r}`" for r in reward_funcs) + " (the column order of `ref_rewards_per_func`)"
               if reward_funcs else "none (no completions sampled: prompt log-likelihoods only)")
    summary = summarize(dataset)
    cols = [f"- `{c}`: {COLUMNS[c]}" for c in dataset.column_names if c in COLUMNS]
    opts = "\n".join(f"| `{k}` | `{v}` |" for k, v in sorted(options.items()))
    stats = ", ".join(f"{k} {v:.4g}" for k, v in summary.items())
    return f"""---
tags:
- trl
- trl-variants
- presample
---

{CARD_MARKER}

# Offline reference pass{f" ({dataset_id})" if dataset_id else ""}

Made by `trl-variants presample` from the reference policy `{model_id}` over {len(dataset)} prompts: {made}.
{use}

## Source
{chr(10).join(_source_lines(source))}
- reference model: `{model_id}`
- reward functions: {rewards}

## Columns
{chr(10).join(cols)}

## Options
| option | value |
|---|---|
{opts}

## Summary
{stats or "prompt log-likelihoods only"}

## Citations
```bibtex
{chr(10).join(citations[n] + chr(10) for n, _ in readers).rstrip() or "(none)"}
```
"""
