"""Prompt tokenization and batched Hugging Face generation shared by the offline passes (presampling, evaluation).

Prompts are tokenized exactly as TRL 1.16's ``GRPOTrainer._tokenize_prompts`` does (chat template with the
generation prompt for conversational prompts, the tokenizer's own call for plain text), so a completion sampled
here is one the trainer could have sampled.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import GenerationConfig
from trl.data_utils import is_conversational


def tokenize_prompts(tokenizer, prompts: Sequence, max_prompt_length: int | None = None, chat_template_kwargs=None):
    """Token ids of each prompt as GRPOTrainer feeds it; longer prompts keep their last ``max_prompt_length``
    tokens (left truncation: the generation prompt survives)."""
    prompts = list(prompts)
    if not prompts:
        return []
    if is_conversational({"prompt": prompts[0]}):
        ids = tokenizer.apply_chat_template(
            conversation=prompts, add_generation_prompt=True, tokenize=True, return_dict=True,
            **(chat_template_kwargs or {}),
        )["input_ids"]
    else:
        ids = tokenizer(text=prompts)["input_ids"]
    ids = [list(x) for x in ids]
    if max_prompt_length is not None:
        ids = [x[-max_prompt_length:] for x in ids]
    return ids


def pack_prompt_completion(prompts, completions, pad_token_id: int):
    """``(input_ids, attention_mask, prompt_width)`` for rows laid out as GRPOTrainer lays them out: the prompt
    left-padded to ``prompt_width``, the completion right-padded after it (width at least 1)."""
    P, C = max(map(len, prompts)), max(1, max(map(len, completions)))
    ids = torch.full((len(prompts), P + C), pad_token_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, P - len(p) : P], attn[i, P - len(p) : P] = torch.tensor(list(p), dtype=torch.long), 1
        if len(c):
            ids[i, P : P + len(c)], attn[i, P : P + len(c)] = torch.tensor(list(c), dtype=torch.long), 1
    return ids, attn, P


def eos_token_ids(tokenizer, model=None) -> list[int]:
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(i for i in ids if i is not None)


def truncate_after_eos(tokens: list[int], eos_ids: Sequence[int]) -> list[int]:
    """Tokens up to and including the first EOS (as GRPOTrainer keeps them)."""
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[: i + 1]
    return tokens


@torch.no_grad()
def generate_completions(
    model,
    tokenizer,
    prompt_ids: Sequence[Sequence[int]],
    num_samples: int = 1,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    generation_kwargs: dict | None = None,
    do_sample: bool = True,
    batch_size: int = 64,
    progress=None,
) -> list[list[list[int]]]:
    """Sample ``num_samples`` completions for every prompt with ``model.generate``.

    Returns, per prompt, a list of ``num_samples`` completion token lists (cut after the first EOS, EOS kept).
    ``batch_size`` counts sequences (prompt x sample) per ``generate`` call. ``progress`` is called with the
    number of prompts finished after each call. The sampling options are GRPOTrainer's (``min_p`` 0 and
    ``repetition_penalty`` 1 are off); ``generation_kwargs`` override them, as GRPOConfig's do.
    """
    device = next(model.parameters()).device
    eos = eos_token_ids(tokenizer, model)
    sampling = dict(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p or None) if do_sample else {}
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, repetition_penalty=repetition_penalty,
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=eos, **sampling)
    # each prompt repeated num_samples times as rows of its own, one sequence per row (as GRPOTrainer generates):
    # the same batch transformers builds for num_return_sequences, and valid under beam search (num_beams < samples)
    config = GenerationConfig(**{**kwargs, **(generation_kwargs or {})}, num_return_sequences=1)
    per_call = max(1, batch_size // num_samples)
    was_training = model.training
    model.eval()
    out: list[list[list[int]]] = []
    try:
        for start in range(0, len(prompt_ids), per_call):
            chunk = [list(p) for p in prompt_ids[start : start + per_call] for _ in range(num_samples)]
            width = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, p in enumerate(chunk):
                ids[i, width - len(p) :] = torch.tensor(p)
                mask[i, width - len(p) :] = 1
            # synced_gpus=False: transformers turns it on whenever ZeRO-3 is active, making every process step with
            # the others; the offline passes run with full (gathered) weights and each process on its own shards
            gen = model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config, synced_gpus=False
            )[:, width:].tolist()
            for i in range(len(chunk) // num_samples):
                out.append([truncate_after_eos(g, eos) for g in gen[i * num_samples : (i + 1) * num_samples]])
            if progress is not None:
                progress(len(chunk) // num_samples)
    finally:
        model.train(was_training)
    return out
