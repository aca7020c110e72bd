"""Prompt formats: the ``prompt`` column per ``--prompt_column`` / ``--prompt_format`` / ``--prompt_regex`` /
``--prompt_suffix`` / ``--system_prompt``, the ``solution`` column, row filters, and ``--filter_prompt_length``
(prompt tokens counted as GRPOTrainer tokenizes them)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .._validation import check_no_none

if TYPE_CHECKING:
    from .arguments import DataScriptArguments


def prepare_columns(ds, script_args: DataScriptArguments, name: str):
    """Filter rows, build the conversational ``prompt`` and the ``solution`` column the rewards read."""
    cols = ds.column_names
    for needed in {script_args.prompt_column, *([script_args.filter_column] if script_args.filter_column else [])}:
        if needed not in cols:
            raise ValueError(f"dataset {name!r} has no column {needed!r} (columns: {cols}); set --prompt_column / "
                             "--filter_column to one of them")
    if script_args.filter_column:
        keep = set(script_args.filter_values or [])
        ds = ds.filter(lambda v: str(v) in keep, input_columns=script_args.filter_column)
        if len(ds) == 0:
            raise ValueError(f"--filter_column {script_args.filter_column} --filter_values {sorted(keep)} left no rows")
    ds = template_prompts(ds, script_args, name)
    if script_args.solution_column != "solution" and script_args.solution_column in ds.column_names:
        if "solution" in ds.column_names:
            ds = ds.remove_columns("solution")
        ds = ds.rename_column(script_args.solution_column, "solution")
    if "accuracy_reward" in (script_args.reward_funcs or []):  # it would score every completion of such a row 0
        check_no_none(ds, "solution", f"dataset {name!r} has no gold answer there; drop those rows (e.g. filter on "
                      "--filter_column) or point --solution_column at the gold-answer column")
    return ds


def template_prompts(ds, script_args: DataScriptArguments, name: str):
    """The ``prompt`` column per ``--prompt_format`` / ``--prompt_regex`` / ``--prompt_suffix`` / ``--system_prompt``:
    a string column becomes one user message (``chat``, after an optional system message) or stays a string
    (``plain``: GRPOTrainer then tokenizes it without the chat template); a conversational column is kept, with the
    system message prepended."""
    column, a = script_args.prompt_column, script_args
    if not len(ds):
        return ds
    if not isinstance(ds[0][column], str):  # conversational: a list of messages
        if a.prompt_format == "plain" or a.prompt_regex or a.prompt_suffix:
            raise ValueError(f"dataset {name!r}: column {column!r} is already conversational (a list of messages); "
                             "--prompt_format plain, --prompt_regex and --prompt_suffix apply to a string column: "
                             "drop them or point --prompt_column at the text column")
        if a.system_prompt:
            system = {"role": "system", "content": a.system_prompt}
            ds = ds.map(lambda m: {"prompt": m if m and m[0]["role"] == "system" else [system, *m]},
                        input_columns=column)
        elif column != "prompt":
            ds = ds.map(lambda m: {"prompt": m}, input_columns=column)
        return ds
    fmt = a.prompt_format
    if fmt == "auto":
        untouched = column == "prompt" and not (a.prompt_suffix or a.prompt_regex or a.system_prompt)
        fmt = "plain" if untouched else "chat"
    pattern = re.compile(a.prompt_regex, re.DOTALL) if a.prompt_regex else None

    def text(t: str) -> str:
        if pattern is not None:
            t = pattern.fullmatch(t).group(1)
        return t + a.prompt_suffix

    if pattern is not None:
        unmatched = [i for i, t in enumerate(ds[column]) if pattern.fullmatch(t) is None]
        if unmatched:
            raise ValueError(f"dataset {name!r}: --prompt_regex does not match {len(unmatched)} of {len(ds)} rows of "
                             f"{column!r} (first: row {unmatched[0]}, {ds[unmatched[0]][column][:120]!r}); fix the "
                             "pattern or filter those rows out")
    if fmt == "plain":
        if column == "prompt" and pattern is None and not a.prompt_suffix:
            return ds
        return ds.map(lambda t: {"prompt": text(t)}, input_columns=column)
    system = [{"role": "system", "content": a.system_prompt}] if a.system_prompt else []
    return ds.map(lambda t: {"prompt": [*system, {"role": "user", "content": text(t)}]}, input_columns=column)


def prompt_lengths(ds, tokenizer, chat_template_kwargs: dict | None = None) -> list[int]:
    """Tokens of each ``prompt`` as GRPOTrainer tokenizes it (the chat template with the generation prompt for a
    conversational prompt, the tokenizer on the text otherwise)."""
    from ..generation import tokenize_prompts

    return [len(ids) for ids in tokenize_prompts(tokenizer, ds["prompt"], None, chat_template_kwargs)]


def filter_prompt_length(ds, tokenizer, max_length: int, chat_template_kwargs: dict | None = None, what: str = "train"):
    """``ds`` without the prompts longer than ``max_length`` tokens (:func:`prompt_lengths`); prints the count."""
    keep = [i for i, n in enumerate(prompt_lengths(ds, tokenizer, chat_template_kwargs)) if n <= max_length]
    print(f"--filter_prompt_length {max_length}: dropped {len(ds) - len(keep)} of {len(ds)} {what} prompts longer "
          f"than {max_length} tokens, {len(keep)} left")
    if not keep:
        raise ValueError(f"--filter_prompt_length {max_length} left no {what} prompts: raise it")
    return ds.select(keep) if len(keep) < len(ds) else ds

