"""Checks of a dataset's stored offline-pass columns before a trainer reads them (before any model loads): presampled
for another trainer (:func:`check_presampled_columns`), or holding values the pass cannot have made
(:func:`check_stored_columns`). Each reader says what it reads and which `trl-variants presample` options make it."""

from __future__ import annotations

from collections.abc import Mapping

from .._validation import _rows, check_finite_column
from .config import COLUMNS
from .summaries import reward_summary


def check_presampled_columns(dataset, needed, trainer_name: str, option: str) -> None:
    """A dataset that already has presample columns but not the ones this trainer needs was presampled for another
    trainer: name the missing columns and the ``trl-variants presample`` option that makes them."""
    columns = getattr(dataset, "column_names", None) or []  # a stream of unknown features: checked once read
    present = [c for c in COLUMNS if c in columns]
    missing = [c for c in needed if c not in columns]
    if present and missing:
        raise ValueError(f"{trainer_name}: the train_dataset was presampled (it has {present}) but lacks {missing}, "
                         f"which {trainer_name} needs. Presample the original prompts again with `trl-variants "
                         f"presample {option}`, or pass the prompts without the presample columns and the trainer "
                         "runs the pass itself")


# How far above 0 a stored log-probability may be before it cannot be one (kernels other than log_softmax, bf16).
LOGP_TOLERANCE = 1e-3
# The `trl-variants presample` options that make each stored quantity, when the reader names none of its own
MAKES = {
    "ref_prompt_logp": "--num_samples 0 --record_prompt_logp true",
    "ref_completion_logps": "--num_samples <N> --record_completion_logps true",
    "ref_value": "--num_samples <N> --value_beta <beta>",
}
STORED_FIX = {
    "ref_prompt_logp": "drop the column (the trainer runs the reference pass) or compute it again with `trl-variants "
                       "presample {options}` on the original prompts",
    "ref_completion_logps": "presample the original prompts again (`trl-variants presample {options}`), or drop the "
                            "ref_* columns and the trainer runs the offline pass itself",
    "ref_value": "presample the original prompts again (`trl-variants presample {options}`), or drop the ref_* "
                 "columns and the trainer runs the offline pass itself",
}


def _arrow(dataset, column: str):
    """``column`` of ``dataset``'s rows (a ``select`` / ``filter`` applied) as one pyarrow array, without Python
    objects per value (a presampled column holds N x k x L floats)."""
    return dataset.with_format("arrow")[column].combine_chunks()


def _first_rows(mask) -> list[int]:
    import pyarrow.compute as pc

    return pc.indices_nonzero(pc.fill_null(mask, True)).to_pylist()


def check_stored_columns(dataset, trainer_name: str, options: str | None, reads) -> None:
    """Stored columns a trainer reads hold values the offline pass can have made; a column that is absent is computed
    by the trainer and not checked. ``reads``: what the trainer reads, any of ``ref_prompt_logp``,
    ``ref_completion_logps``, ``ref_value`` (a mapping: each to the column that holds it, where the reader renames
    it); ``options``: the `trl-variants presample` options that make them, named in the fix (None: :data:`MAKES`).
    Refused, naming the column, the rows, an example value and the fix:

    * ``ref_prompt_logp``: not a finite number, or above 0 (a sum of log-probs; :data:`LOGP_TOLERANCE` allowed);
    * ``ref_completion_logps``: not one list per completion of ``ref_completion_ids``, not one value per completion
      token (a loss would pad the missing ones with log-prob 0), a value above 0 or not finite;
    * a column computed from the rewards (``ref_value``): by the check its method registered with it
      (:mod:`~trl_variants.presample.summaries`).

    A stream (``IterableDataset``) is not read: its rows would be consumed before training; the trainers' own
    checks of the columns apply when the offline pass reads it."""
    columns = getattr(dataset, "column_names", None)
    if columns is None or isinstance(dataset, dict) or not hasattr(dataset, "__len__"):
        return
    reads = dict(reads) if isinstance(reads, Mapping) else {kind: kind for kind in reads}
    # a dataset's content passed already (a trainer checks its training set at construction, and again where the
    # offline pass reads it): not read twice; a fingerprint changes with every transform of the dataset
    key = (getattr(dataset, "_fingerprint", None), tuple(sorted(reads.items())))
    if key[0] is not None and key in _PASSED:
        return

    def fix(kind: str) -> str:
        return STORED_FIX[kind].format(options=options or MAKES[kind])

    column = reads.get("ref_prompt_logp")
    if column is not None and column in columns:
        try:
            check_finite_column(dataset, column, fix("ref_prompt_logp"))
        except ValueError as e:
            raise ValueError(f"{trainer_name}: {e}") from None
        above = [i for i, v in enumerate(dataset[column]) if v > LOGP_TOLERANCE]
        if above:
            raise ValueError(f"{trainer_name}: column {column!r} holds l_ref(s), a sum of log-probs (<= 0), but "
                             f"{_rows(above)} are above 0 (e.g. row {above[0]}: {dataset[above[0]][column]!r}): it was "
                             f"not made by the offline pass for these prompts. Fix: {fix('ref_prompt_logp')}")
    if "ref_completion_logps" in reads and {"ref_completion_logps", "ref_completion_ids"} <= set(columns):
        _check_completion_logps(dataset, trainer_name, fix("ref_completion_logps"))
    for kind in reads:  # a column computed from the rewards: checked by the method that declared it
        summary = reward_summary(kind) if kind in columns else None
        if summary is not None and summary.check is not None:
            summary.check(dataset, trainer_name, fix(kind))
    if key[0] is not None:
        _PASSED.add(key)


_PASSED: set = set()  # (fingerprint, what was read) of the datasets whose stored columns passed


def _check_completion_logps(dataset, trainer_name: str, fix: str) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    name = "'ref_completion_logps'"
    logps, ids = _arrow(dataset, "ref_completion_logps"), _arrow(dataset, "ref_completion_ids")
    try:
        per_row = pc.not_equal(pc.list_value_length(logps), pc.list_value_length(ids))
        bad = _first_rows(per_row)
        if bad:
            i = bad[0]
            raise ValueError(f"{trainer_name}: column {name} has, at {_rows(bad)}, another number of completions than "
                             f"'ref_completion_ids' (e.g. row {i}: {_len(logps[i])} and {_len(ids[i])}): it does not "
                             f"belong to these completions. Fix: {fix}")
        flat_logps, flat_ids = pc.list_flatten(logps), pc.list_flatten(ids)
        row_of = pc.list_parent_indices(logps)  # the row of each completion
        mismatch = pc.fill_null(pc.not_equal(pc.list_value_length(flat_logps), pc.list_value_length(flat_ids)), True)
        where = pc.indices_nonzero(mismatch).to_pylist()
        if where:
            rows = sorted(set(row_of.take(pa.array(where)).to_pylist()))
            c = where[0]
            row = row_of[c].as_py()
            j = c - pc.indices_nonzero(pc.equal(row_of, row))[0].as_py()
            raise ValueError(
                f"{trainer_name}: column {name} has, at {_rows(rows)}, a completion with another number of log-probs "
                f"than its tokens in 'ref_completion_ids' (e.g. row {row}, completion {j}: {_len(flat_logps[c])} "
                f"log-probs for {_len(flat_ids[c])} tokens): one reference log-prob per completion token is what "
                f"the loss reads (a missing one counts as log-prob 0). Fix: {fix}")
        values = pc.list_flatten(flat_logps)
        value_row = row_of.take(pc.list_parent_indices(flat_logps))
        wrong = pc.fill_null(pc.or_(pc.invert(pc.is_finite(values)), pc.greater(values, LOGP_TOLERANCE)), True)
        where = pc.indices_nonzero(wrong).to_pylist()
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, TypeError):
        raise ValueError(f"{trainer_name}: column {name} must hold, per row, a list of per-token log-prob lists (one "
                         f"per completion of 'ref_completion_ids'); its type is {logps.type}. Fix: {fix}") from None
    if where:
        rows = sorted(set(value_row.take(pa.array(where)).to_pylist()))
        raise ValueError(f"{trainer_name}: column {name} holds per-token log-probs (<= 0, finite), but {_rows(rows)} "
                         f"do not (e.g. row {value_row[where[0]].as_py()}: {values[where[0]].as_py()!r}). Fix: {fix}")


def _len(value) -> str:
    return "None" if not value.is_valid else str(len(value))
