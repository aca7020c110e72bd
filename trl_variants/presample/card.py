"""The Hub dataset card of a presampled dataset."""

from __future__ import annotations

from .config import COLUMNS
from .metadata import presample_options, summarize


def dataset_card(dataset, model_id: str, dataset_id: str | None = None) -> str:
    """A Hub dataset card (README.md) for a presampled dataset: what the columns are, the options, the summary, and
    the citations of the methods that consume it."""
    from .._citations import APO, DPH, ERPO

    options = presample_options(dataset) or {}
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

# Offline reference pass{f" ({dataset_id})" if dataset_id else ""}

Made by `trl-variants presample` from the reference policy `{model_id}` over {len(dataset)} prompts: stage 1 of
A*-PO (N samples, V_hat), DPH-RL (k samples, reward split, per-token reference log-probs) and ERPO's reference
prompt log-likelihoods. Pass it to `APOTrainer`, `DPHTrainer` or `ERPOTrainer` as `train_dataset` and no sampling
runs before training.

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
{APO}

{DPH}

{ERPO}
```
"""
