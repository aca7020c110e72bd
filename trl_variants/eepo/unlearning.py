"""The weight mechanics of EEPO's unlearning step (Algorithm 1, step 3) across processes: the gradient summed over
processes (DDP, ZeRO-1/2) or over FSDP2's shards, and the share of the step the weights kept. The step itself is in
``part.py``; freeing FSDP2's gathered full weights, so that the next forward sees the edited shards, is
``_model.drop_gathered_weights``."""

from __future__ import annotations

import collections

import torch

from .._model import fsdp2_sharded
from .._numerics import _local


def share_of_step_kept(params, saved, grads, lr: float, reduce=None) -> float | None:
    """The share of the unlearning step's first-order effect on the loss that the weights kept:
    ``sum g . (saved - p) / (lr sum g^2)``, accumulated in float64 from float32 products. 1 when each weight moved by
    exactly ``-lr g``; below 1 where low-precision weights (bf16 under DeepSpeed ZeRO-1/2) round updates smaller than
    half their spacing away; None for a step with no gradient. The same on every process: the gradients are reduced
    and the weights are replicas, or (FSDP2) each process sums its own shards and ``reduce`` sums the processes'.
    One host transfer per device (the per-tensor float32 sums, summed on the host)."""
    sums = collections.defaultdict(list)  # device -> [(applied, intended) of each tensor there]
    for p, s, g in zip(params, saved, grads, strict=True):
        if g is not None:
            p, s, g32 = _local(p), _local(s), _local(g).float()
            sums[g32.device].append(torch.stack([(g32 * (s.float() - p.float())).sum(), g32.square().sum()]))
    total = sum((torch.stack(pairs).cpu().double().sum(0) for pairs in sums.values()), torch.zeros(2, dtype=torch.float64))
    if reduce is not None:
        total = reduce(total)
    applied, intended = total[0].item(), lr * total[1].item()
    return applied / intended if intended > 0 else None


def unlearning_gradient(trainer, model, u) -> tuple[list, list]:
    """The trainable parameters of ``model`` (the unwrapped policy) and the gradient of ``u`` (this process's share
    of the global loss) summed over processes, one entry per parameter (None where unused), without touching what
    the optimizer sees.

    DDP, ZeRO-1/2, one process: ``torch.autograd.grad`` on the unwrapped module (nothing accumulates into ``.grad``,
    no DDP hook fires), then a sum over processes. FSDP2: the forward ran on weights all-gathered from the shards,
    so the gradient reaches each sharded parameter only through FSDP's own backward, which reduce-scatters it into
    ``.grad`` as the mean over processes: the step runs ``backward``, takes each shard's gradient times the number of
    processes (the sum), and puts back whatever ``.grad`` held before (None: rollouts start accumulation cycles, and
    within a cycle FSDP keeps gradients in its own buffers). The parameters are read after the backward, which
    leaves every module sharded. Before it, the unit of the final norm, the LM head and the tied embeddings still
    holds its full weights (Accelerate does not reshard it after a forward), and torch 2.11 cannot free them there
    (TRL's fused head never runs the head's forward, so the unit's forward stays unfinished): read then, their
    gradient, moved to the shards by the backward, was lost and the step left them as they were (2 processes trained
    unlike 1).
    Within a gradient-accumulation cycle Accelerate turns FSDP's gradient reduction off; it is turned on for this
    backward (else the gradient would stay unreduced in FSDP's own buffers and join the training step's)."""
    if not fsdp2_sharded(trainer):
        params = [p for p in model.parameters() if p.requires_grad]
        grads = list(torch.autograd.grad(u, params, allow_unused=True))
        if trainer.accelerator.num_processes > 1:  # Accelerate's reduce returns a copy (one process too: skipped)
            for i, g in enumerate(grads):  # one parameter's copy at a time, not a second copy of every gradient
                grads[i] = g if g is None else trainer.accelerator.reduce(g, "sum")
        return params, grads
    held = {}
    for p in model.parameters():
        held[p], p.grad = p.grad, None
    accumulating = not trainer.accelerator.sync_gradients  # inside Accelerate's no_sync: FSDP would keep the gradient
    if accumulating:  # unsharded on each process, unreduced, and add it to the step's training gradient
        model.set_requires_gradient_sync(True)
    try:
        u.backward()
    finally:
        if accumulating:
            model.set_requires_gradient_sync(False)
    params = [p for p in model.parameters() if p.requires_grad]  # the shards, now
    world = trainer.accelerator.num_processes
    grads = [None if p.grad is None else p.grad.detach() * world for p in params]
    for p in params:
        p.grad = held.get(p)
    return params, grads
