"""The evaluation loop (:func:`evaluate`): check everything before anything loads, load, cut the work into chunks,
share them out between processes, sample and score each (:mod:`.sampling`), append it to the results file
(:mod:`.resume`), and aggregate (:mod:`.metrics`)."""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from .._validation import (
    check_reward_column_values,
    check_train_dataset,
    checked_reward_funcs,
    ensure_pad_token,
)
from ..generation import tokenize_prompts
from ..presample.logprobs import check_prompt_lengths
from ..presample.reward_calls import check_reward_columns
from ..presample.vllm_backend import check_vllm_options, vllm_version
from ..rewards import accuracy_reward
from .config import EvalConfig
from .metrics import aggregate, correctness_index, reward_labels
from .resume import ResultsFile, run_key
from .sampling import check_backend, eval_device, make_generator, pass_config, run_chunk


def _on_device(where: torch.device, device) -> bool:
    """Whether a tensor on ``where`` is on ``device`` (``cpu`` is ``cpu:0``; an index left out is the current one)."""
    device = torch.device(device)
    return where.type == device.type and (where.index is None or device.index is None or where.index == device.index
                                          or where.type == "cpu")


def evaluate(
    model,
    tokenizer,
    dataset,
    reward_funcs: Callable | Sequence[Callable] = accuracy_reward,
    config: EvalConfig | None = None,
    *,
    name: str | None = None,
    reference_model=None,
    base_results: dict | None = None,
    accelerator=None,
    results_file=None,
    restart: bool = False,
    generator=None,
    correctness_func: Callable | str | None = None,
    device=None,
    dtype=None,
    chat_template_kwargs: dict | None = None,
) -> dict:
    """Evaluate one model on ``dataset`` (``prompt`` + the columns the rewards read, e.g. ``solution``).

    A sample is correct when ONE reward function, ``correctness_func`` (one of ``reward_funcs`` or its name;
    default: ``accuracy_reward``, or the only function; :func:`correctness_index`), gives it a value > 0; every
    function's mean value is reported beside (``reward_means``), never summed into correctness.

    ``model`` / ``reference_model``: a path or Hub id, or a model object (then ``tokenizer`` is required; the vLLM
    backend needs a path, as it loads its own copy of the weights).
    ``base_results``: the result dict of the base model on the same prompts: adds keep / exploration rates.
    ``accelerator``: an ``Accelerator`` or ``PartialState`` sharing the chunks between processes (every process
    must call, and every one returns the full result).
    ``results_file``: a JSON-lines file the finished chunks are appended to and resumed from
    (:mod:`trl_variants.evaluation`); ``restart``: discard what it holds. ``generator``: what samples, replacing the ``config.backend`` one (the
    held-out callback passes the trainer's vLLM engine).
    ``device``: where a model loaded from a path goes in a single process (default :func:`eval_device`: the GPU
    when there is one; a model object stays where it is unless ``device`` is given; with ``accelerator``, its
    device); the device and dtype are printed. ``dtype``: ``from_pretrained``'s (``"bfloat16"``, ``"auto"``...).
    ``chat_template_kwargs``: extra ``apply_chat_template`` arguments for conversational prompts.
    Returns a dict: ``name``, ``config``, ``correctness_func`` and ``reward_funcs`` (names), ``greedy`` accuracy,
    and per temperature ``avg@k``, ``pass@k'``, ``entropy``, ``mean_length``, ``kl_to_reference`` (if asked), the
    per-prompt ``correct`` counts, ``reward_means`` (each function's mean value), ``stopped_at_limit`` (the share
    of samples cut at ``max_completion_length``) and keep / exploration rates (if ``base_results``); greedy's
    ``reward_means`` and ``stopped_at_limit`` are ``greedy_reward_means`` and ``greedy_stopped_at_limit``.
    """
    from accelerate.utils import gather_object
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = config or EvalConfig()
    reward_funcs = [reward_funcs] if callable(reward_funcs) else list(reward_funcs)
    if not reward_funcs:
        raise ValueError("evaluate needs at least one reward function")
    correctness = correctness_index(reward_funcs, correctness_func)  # before the wrapping (identity is kept)
    reward_funcs = checked_reward_funcs(reward_funcs)  # as the offline pass: bad values refused, naming the function
    # --- every check before anything loads ---
    if generator is None:
        check_backend(config.backend)
        if config.backend == "vllm" and not isinstance(model, str | Path):
            raise ValueError("backend='vllm' needs the model as a path or Hub id: vLLM loads its own copy of the "
                             "weights, which could differ from the model object passed. Pass the path, or use "
                             "backend='hf'")
    dataset = dataset.select_columns([c for c in dataset.column_names if not c.startswith("ref_")])
    check_train_dataset(dataset, "evaluate", split="dataset")
    if len(dataset) == 0:
        raise ValueError("the dataset is empty")
    if not reward_funcs:
        raise ValueError("evaluate needs at least one reward function")
    check_reward_columns(reward_funcs, dataset.column_names)
    check_reward_column_values(reward_funcs, dataset, "evaluate")  # no None where a reward function reads a column
    passes = ([("greedy", None)] if config.greedy else []) + [(str(t), t) for t in config.temperatures]
    if config.backend == "vllm" or generator is not None:
        for _, t in passes:
            check_vllm_options(pass_config(config, t))
    # --- load ---
    loaded = isinstance(model, str | Path)
    load_kwargs = {"dtype": dtype} if dtype is not None else {}
    if loaded:
        name = name or Path(str(model)).name
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(model), padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(str(model), **load_kwargs)
    if isinstance(reference_model, str | Path):
        reference_model = AutoModelForCausalLM.from_pretrained(str(reference_model), **load_kwargs)
    if tokenizer is None:
        raise ValueError("tokenizer is required when model is a model object")
    ensure_pad_token(tokenizer)  # as GRPOTrainer: no pad token (Llama 3, Mistral) pads with EOS
    if accelerator is not None:
        device = accelerator.device
    elif loaded or device is not None:
        device = eval_device(device)
    else:  # a model object (a trainer's policy) stays where it is
        device = next(model.parameters()).device
    name = name or getattr(model.config, "_name_or_path", "model")
    scores = config.compute_entropy or reference_model is not None
    moved = config.backend == "hf" or generator is not None or scores
    # with its own vLLM engine and nothing to score, the model stays off the GPU. A model already there is left as it
    # is: under FSDP2 ``.to`` reshards every module, and a trainer's evaluation holds the full weights
    # (``whole_policy_for_generation``): each module would gather them again at its first forward, a collective
    if moved and not all(_on_device(p.device, device) for p in model.parameters()):
        model = model.to(device)
    if loaded and (accelerator is None or accelerator.is_main_process):
        dtype_name = str(next(model.parameters()).dtype).removeprefix("torch.")
        where = f"evaluate {name}: model on {device if moved else next(model.parameters()).device} ({dtype_name})"
        if generator is None and config.backend == "vllm":
            where += (": it scores the entropy / KL of vLLM's samples" if scores else ", unused: vLLM samples and "
                      "nothing is scored (compute_entropy false, no reference model)")
            if scores and device.type == "cpu":
                where += "; on the CPU this pass is slow: --compute_entropy false skips it"
        print(where, flush=True)
    if reference_model is not None:
        reference_model = reference_model.to(device)
    prompt_ids = tokenize_prompts(tokenizer, list(dataset["prompt"]), None, chat_template_kwargs)
    check_prompt_lengths(prompt_ids, minimum=1)

    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator is not None else (0, 1)
    n_chunks = math.ceil(len(dataset) / config.chunk_size)
    units = [(label, t, c) for label, t in passes for c in range(n_chunks)]
    store = None
    if results_file is not None:
        backend = generator.name if generator is not None else (
            f"vllm=={vllm_version()}" if config.backend == "vllm" else "hf")
        key = run_key(model, dataset, prompt_ids, reward_funcs, config, backend, reference_model, correctness)
        store = ResultsFile(results_file, key, restart=restart, writer=rank == 0)
        if world > 1:
            accelerator.wait_for_everyone()  # every process has read the file before the main one writes it
        store.start()
    records = dict(store.done) if store is not None else {}
    if store is not None and world > 1:  # the writer's records decide: a file local to each node may differ elsewhere,
        from accelerate.utils import broadcast_object_list  # and every process must run the same rounds below

        records = broadcast_object_list([records], from_process=0)[0]
    todo = [u for u in units if (u[0], u[2]) not in records]

    def chunk_rows(c):
        return list(range(c * config.chunk_size, min(len(dataset), (c + 1) * config.chunk_size)))

    done_prompts = sum(len(chunk_rows(c)) for label, _, c in units if (label, c) in records)
    if rank == 0 and done_prompts:
        print(f"evaluate {name}: {len(units) - len(todo)} of {len(units)} chunks read back from {results_file}",
              file=sys.stderr, flush=True)
    bar = tqdm(total=len(passes) * len(dataset), initial=done_prompts, desc=f"evaluate {name}", unit="prompt",
               disable=rank != 0 or not config.show_progress, leave=None, dynamic_ncols=True)
    own_generator = generator is None
    if own_generator and (todo or world > 1):  # no engine for a finished run (but processes start together)
        generator = make_generator(config, model, tokenizer, accelerator)
    try:
        if generator is not None:
            generator.prepare()  # on every process, before any chunk (weight pushes are collectives)
        for start in range(0, len(todo), world):  # one chunk per process per round, then the results are gathered
            round_units = todo[start : start + world]
            mine = round_units[rank] if rank < len(round_units) else None
            record = None
            if mine is not None:
                label, temperature, c = mine
                bar.set_postfix_str("greedy" if temperature is None else f"T={label}")
                rows_idx = chunk_rows(c)
                record = run_chunk(model, tokenizer, list(dataset.select(rows_idx)),
                                    [prompt_ids[i] for i in rows_idx], rows_idx, c, label, temperature, config,
                                    generator, reward_funcs, reference_model, correctness=correctness)
            finished = [r for r in gather_object([record]) if r is not None] if world > 1 else [record]
            for r in finished:
                if store is not None:
                    store.append(r)
                records[(r["pass"], r["chunk"])] = r
                bar.update(len(r["correct"]))
    finally:
        bar.close()
        if generator is not None:
            generator.finish()
    missing = [(label, c) for label, _, c in units if (label, c) not in records]
    if missing:  # e.g. N lone processes that were told they are N (no process group to share the results)
        raise RuntimeError(f"evaluate: no results for chunks {missing[:4]} ({len(missing)} in all) after every "
                           f"process finished its share ({world} processes): the processes did not exchange their "
                           "results. Launch with accelerate launch or torchrun on a working process group")
    unrewarded = sum(r.get("unrewarded", 0) for r in records.values())
    labels = reward_labels(reward_funcs)
    if unrewarded and rank == 0:
        warnings.warn(f"evaluate: {unrewarded} completions got no value from the correctness function "
                      f"{labels[correctness]} (None or NaN): they never count as correct", stacklevel=2)
    results: dict = {"name": name, "config": asdict(config), "num_prompts": len(dataset),
                     "correctness_func": labels[correctness], "reward_funcs": labels}
    results.update(aggregate(records, passes, n_chunks, config, dataset, config.compute_entropy or
                              reference_model is not None, reference_model is not None, base_results, labels))
    return results
