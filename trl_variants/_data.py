"""Streaming datasets (``datasets.IterableDataset``) in the offline passes.

An offline pass needs every prompt before training (ERPO's l_ref(s) from the starting model, DPH-RL's split,
A*-PO's values), so a stream is read once, in full, into an in-memory ``Dataset`` (:func:`read_stream`; it must be
finite). The pass runs on that copy; the trainer then keeps training on the user's stream, in the stream's own order,
with the pass's columns looked up by prompt (:func:`stream_with_columns`): GRPOTrainer's handling of iterable data
(no shuffling, no ``len``) is unchanged.
"""

from __future__ import annotations

import json


def is_stream(dataset) -> bool:
    from datasets import IterableDataset

    return isinstance(dataset, IterableDataset)


def read_stream(stream, what: str):
    """All rows of ``stream`` as a ``datasets.Dataset`` (with a progress bar), for an offline pass."""
    from datasets import Dataset
    from tqdm.auto import tqdm

    rows = list(tqdm(stream, desc=f"reading the streaming dataset for {what}", unit="row"))
    if not rows:
        raise ValueError(f"the streaming dataset has no rows: nothing for {what}")
    return Dataset.from_list(rows)


def prompt_key(prompt) -> str:
    """A row's identity for the lookup: its prompt, as canonical JSON (the same prompt gives the same columns)."""
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False)


def stream_with_columns(stream, table, columns):
    """``stream`` with ``columns`` of ``table`` (a ``Dataset`` made from the same rows) added to each row, found by
    its prompt; rows whose prompt is not in ``table`` (left out by the pass) are dropped, as the pass dropped them.
    Lazy: nothing is read here."""
    lookup = {prompt_key(p): values for p, *values in zip(table["prompt"], *(table[c] for c in columns), strict=True)}
    keep = set(lookup)
    present = [c for c in columns if c in (stream.column_names or [])]
    if present:  # the pass's values replace any the stream carries
        stream = stream.remove_columns(present)
    return stream.filter(lambda row: prompt_key(row["prompt"]) in keep).map(
        lambda row: dict(zip(columns, lookup[prompt_key(row["prompt"])], strict=True)))


def run_on_rows(dataset, run_pass, columns, what: str):
    """``(dataset for the trainer, the pass's own Dataset)``: ``run_pass`` (a ``Dataset`` in, the rows it keeps with
    its columns out) applied to ``dataset``; for a stream, to the rows read from it, and the trainer gets the stream
    with ``columns`` looked up (:func:`stream_with_columns`)."""
    if not is_stream(dataset):
        table = run_pass(dataset)
        return table, table
    table = run_pass(read_stream(dataset, what))
    return stream_with_columns(dataset, table, list(columns)), table
