"""Reference log-probabilities: per token, per prompt, per completion (the scoring half of the pass)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def left_pad(rows: Sequence[Sequence[int]], pad_id: int):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r):
            ids[i, width - len(r) :] = torch.tensor(list(r))
            mask[i, width - len(r) :] = 1
    return ids, mask


LOGITS_PER_FORWARD = 2**28
"""At most this many logits (rows x positions x vocabulary) per scoring forward of :func:`token_logps`: its float32
copies (log-softmax, and the entropy's) stay near 1 GiB each. Evaluation's default 32 rows of 4k tokens with
Qwen2.5's 152k-token vocabulary would hold 80 GB in each copy, more than a GPU has."""


def _vocab_size(model) -> int:
    """The logits' width: the config's ``vocab_size`` (a head partitioned by DeepSpeed ZeRO-3 holds 0 rows here),
    else the output head's rows."""
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    if size:
        return size
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return head.weight.size(0) if head is not None else 1


def rows_per_forward(model, batch_size: int, width: int) -> int:
    """``batch_size`` rows of ``width`` tokens, fewer (at least one) where their logits would pass
    :data:`LOGITS_PER_FORWARD`."""
    return max(1, min(batch_size, LOGITS_PER_FORWARD // max(1, (width - 1) * _vocab_size(model))))


@torch.no_grad()
def token_logps(model, input_ids, attention_mask, temperature: float = 1.0, batch_size: int = 8,
                with_entropy: bool = False):
    """``log softmax(logits / temperature)`` of each next token: a ``(B, L - 1)`` tensor whose column ``t`` scores
    token ``t + 1``. Zero where the token or its predecessor is padding (so the first real token, which has no
    prediction, is skipped). Uses the model's plain forward; rows are processed ``batch_size`` at a time, fewer
    where a forward's logits would pass :data:`LOGITS_PER_FORWARD` (long sequences, large vocabularies).
    With ``with_entropy`` also returns the entropy of each predictive distribution (same shape)."""
    device = next(model.parameters()).device
    batch_size = rows_per_forward(model, batch_size, input_ids.size(1))
    out, entropies = [], []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, input_ids.size(0), batch_size):
            ids = input_ids[start : start + batch_size].to(device)
            mask = attention_mask[start : start + batch_size].to(device)
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float() / temperature
            all_logps = torch.log_softmax(logits, dim=-1)
            logps = all_logps.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            valid = (mask[:, 1:] * mask[:, :-1]).bool()
            out.append(logps.masked_fill(~valid, 0.0).cpu())
            if with_entropy:
                ent = -(all_logps.exp() * all_logps).sum(-1)
                entropies.append(ent.masked_fill(~valid, 0.0).cpu())
    finally:
        model.train(was_training)
    return (torch.cat(out), torch.cat(entropies)) if with_entropy else torch.cat(out)


def prompt_logps_from_ids(
    model, prompt_ids, pad_token_id: int, temperature: float = 1.0, batch_size: int = 8, token_logps_fn=None
) -> torch.Tensor:
    """``l(s)`` for each tokenized prompt: the sum of its token log-probs, first token skipped (1-D float tensor).

    ``token_logps_fn(input_ids, attention_mask) -> (B, L - 1)`` replaces :func:`token_logps` (a trainer passes its
    own fused, temperature-scaled scorer so that ``l_ref`` and its ``l_theta`` come from the same kernel)."""
    out = []
    for start in range(0, len(prompt_ids), batch_size):
        ids, mask = left_pad(prompt_ids[start : start + batch_size], pad_token_id)
        if token_logps_fn is None:
            logps = token_logps(model, ids, mask, temperature, batch_size)
        else:
            logps = token_logps_fn(ids, mask).float().cpu()
        out.append((logps * (mask[:, 1:] * mask[:, :-1])).sum(-1))
    return torch.cat(out)


def completion_token_logps(
    model, prompt_ids: Sequence[int], completions: Sequence[Sequence[int]], temperature: float = 1.0,
    batch_size: int = 8, pad_token_id: int = 0, token_logps_fn=None,
) -> list[list[float]]:
    """Per-token log-probs of each completion given the prompt (one list per completion, same length)."""
    if not completions:
        return []
    rows = [list(prompt_ids) + list(c) for c in completions]
    ids, mask = left_pad(rows, pad_token_id)
    if token_logps_fn is None:
        logps = token_logps(model, ids, mask, temperature, batch_size)
    else:
        logps = token_logps_fn(ids, mask).float().cpu()
    out = []
    for i, c in enumerate(completions):
        n = len(c)
        out.append(logps[i, logps.size(1) - n :].tolist() if n else [])
    return out


def check_prompt_lengths(ids, minimum: int = 2):
    """Refuse prompts with fewer than ``minimum`` tokens (naming the rows): an empty prompt cannot be sampled from,
    and a one-token prompt has no log-likelihood (its first token is not predicted)."""
    short = [i for i, x in enumerate(ids) if len(x) < minimum]
    if short:
        why = "their log-likelihood is undefined" if minimum > 1 else "there is nothing to generate from"
        raise ValueError(f"prompts at rows {short[:5]} ({len(short)} in all) have fewer than {minimum} tokens: {why}. "
                         "Remove empty prompts from the dataset (e.g. dataset.filter(...))")
