"""ERPO's part of the offline pass: ``l_ref(s)``, the frozen reference's log-likelihood of every prompt, computed once
before training and stored as a dataset column (the Query-KL's fixed side, eq. 10-11)."""

from __future__ import annotations

from collections.abc import Sequence

from .._validation import check_train_dataset
from ..generation import tokenize_prompts
from ..presample.config import REF_PROMPT_LOGP
from ..presample.logprobs import check_prompt_lengths, prompt_logps_from_ids


def reference_prompt_logps(
    model, tokenizer, prompts: Sequence, *, temperature: float = 1.0, batch_size: int = 8, max_prompt_length=None,
    token_logps_fn=None, tokenize_fn=None,
) -> list[float]:
    """ERPO's ``l_ref(s)`` for every prompt (plain or conversational), tokenized as GRPOTrainer tokenizes them
    (``tokenize_fn``: a trainer's own tokenization, see :func:`trl_variants.presample.presample`)."""
    ids = tokenize_fn(list(prompts)) if tokenize_fn is not None else tokenize_prompts(tokenizer, prompts,
                                                                                      max_prompt_length)
    check_prompt_lengths(ids)
    return prompt_logps_from_ids(model, ids, tokenizer.pad_token_id, temperature, batch_size, token_logps_fn).tolist()


def add_reference_prompt_logps(
    dataset, model, tokenizer, *, column: str = REF_PROMPT_LOGP, temperature: float = 1.0, batch_size: int = 8,
    accelerator=None, token_logps_fn=None, tokenize_fn=None, desc: str = "reference prompt log-likelihoods",
):
    """Return ``dataset`` with ``column`` = ``l_ref(s)`` of every row's ``prompt`` (ERPO's pre-computed Query-KL
    term). Under an ``accelerator`` with several processes each computes a contiguous shard and the results are
    gathered in the original order. ``tokenize_fn``: a trainer's own tokenization, called with the dataset's rows
    (dicts): with ``environment_factory`` a prompt is the row's prompt plus the observation ``reset(**row)`` returns
    (:func:`trl_variants._offline.trainer_prompt_ids`)."""
    from accelerate.utils import gather_object
    from tqdm.auto import tqdm

    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    per = -(-len(dataset) // world)
    mine = list(range(rank * per, min(len(dataset), (rank + 1) * per)))
    trainer_ids = None
    if tokenize_fn is not None and "prompt" in dataset.column_names:
        # the trainer's prompts first: its refusals (an environment making a new prompt at each reset) name the cause
        trainer_ids = [list(ids) for ids in tokenize_fn(list(dataset.select(mine)))] if mine else []
    check_train_dataset(dataset, "ERPO reference pass", split="dataset")
    values: list[float] = []
    bar = tqdm(total=len(mine), desc=desc, disable=rank != 0, unit="prompt")
    chunk = max(batch_size, 256)
    for start in range(0, len(mine), chunk):
        idx = mine[start : start + chunk]
        if trainer_ids is None:
            ids = tokenize_prompts(tokenizer, dataset.select(idx)["prompt"])
        else:
            ids = trainer_ids[start : start + chunk]
        check_prompt_lengths(ids)
        values += prompt_logps_from_ids(model, ids, tokenizer.pad_token_id, temperature, batch_size,
                                        token_logps_fn).tolist()
        bar.update(len(idx))
    bar.close()
    if world > 1:
        values = gather_object(values)
    if column in dataset.column_names:
        dataset = dataset.remove_columns(column)
    return dataset.add_column(column, values)
