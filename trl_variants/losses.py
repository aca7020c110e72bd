"""The algorithms' math as small pure functions on tensors (no trainer state, no I/O).

Each function is named after what it computes and cites the equation it implements. The trainers call these; they
are also public API. On low-precision inputs (bf16 / fp16 log-probs, as FSDP's mixed precision or a bf16 model
returns them) each function does its own arithmetic in float32 (:func:`at_least_float32`): in bf16 ``1 - 1e-3`` rounds
to 1 and ``exp(d) - d - 1`` cancels to noise; float64 stays float64. (A difference a caller formed in bf16 before the
call stays as rounded.) Equation, section and table numbers are the papers' own (ERPO: the anonymous preprint "Beyond
the Stability-Exploration Dilemma"; EEPO: arXiv 2510.05837; DPH-RL: arXiv 2509.07430; A*-PO: arXiv 2505.20686);
docs/algorithms.md writes every equation out with its defaults.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "apo_loss",
    "f_divergence",
    "js_definition_terms",
    "optimal_value",
    "query_kl",
    "query_weights",
    "reference_query_weights",
    "unlearning_loss",
    "vllm_importance_sampling_ratio",
]


def at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 when it is bf16 or fp16, else unchanged (a differentiable cast: gradients flow back)."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


# ----------------------------------------------------------------------------------------------------- ERPO ---
def query_weights(prompt_logps: torch.Tensor) -> torch.Tensor:
    """ERPO query weights, eq. (8) / App. G: ``w_B(s) = mean_B(l) / l(s)``.

    Args:
        prompt_logps: 1-D tensor, one log-likelihood ``l(s) = log P_theta(s)`` (< 0) per distinct prompt of batch B.
    Returns:
        1-D tensor of weights (mean 1 in harmonic sense; likelier prompts, ``l`` closer to 0, get weights > 1).
        Computed under stop-gradient: the result carries no graph.
    """
    if prompt_logps.dim() != 1 or prompt_logps.numel() == 0:
        raise ValueError(f"prompt_logps must be a non-empty 1-D tensor, got shape {tuple(prompt_logps.shape)}")
    logp = prompt_logps.detach().float()
    if (logp >= 0).any():
        raise ValueError("prompt log-likelihoods must be < 0 (a prompt of at least one scored token)")
    return logp.mean() / logp


def reference_query_weights(ref_prompt_logps: torch.Tensor, dataset_mean: float, max_weight: float = 2.0):
    """ERPO query weights from the frozen reference (later version of the paper):
    ``w(s) = clip(mean_dataset(l_ref) / l_ref(s), 0, max_weight)``, fixed for the whole run."""
    return (dataset_mean / ref_prompt_logps.detach().float()).clamp(0.0, max_weight)


def query_kl(
    policy_prompt_logps: torch.Tensor, ref_prompt_logps: torch.Tensor, estimator: str = "k3"
) -> torch.Tensor:
    """ERPO Query-KL, eq. (10)-(11): per-prompt KL estimate from ``d = l_ref(s) - l_theta(s)``.

    ``"k3"`` (default): ``exp(d) - d - 1`` with ``d`` clamped to [-20, 20] and the result clamped to at most 10;
    ``"k1"`` (eq. 11 literally): ``-d = l_theta - l_ref``. Returns one value per prompt (same shape as the inputs);
    the caller averages over distinct prompts. Gradient flows through ``policy_prompt_logps`` only.
    """
    d = at_least_float32(ref_prompt_logps.detach()) - at_least_float32(policy_prompt_logps)
    if estimator == "k3":
        d = d.clamp(-20.0, 20.0)
        return (torch.exp(d) - d - 1.0).clamp(max=10.0)
    if estimator == "k1":
        return -d
    raise ValueError(f"estimator must be 'k3' or 'k1', got {estimator!r}")


# ----------------------------------------------------------------------------------------------------- EEPO ---
def unlearning_loss(
    per_token_logps: torch.Tensor, completion_mask: torch.Tensor, eps_low: float, eps_high: float
) -> torch.Tensor:
    """EEPO rollout-model unlearning objective, eq. (7)-(11), as a loss to MINIMISE:
    ``U = mean_seq mean_tok -log(1 - clip(p, eps_low, 1 - eps_high))``, ``p = exp(per_token_logps)``.

    Descending U lowers the probability of the sampled tokens. Where ``p`` is clipped the gradient is zero.
    Sequences with no unmasked token are ignored.
    """
    seq_mean, valid = unlearning_sequence_terms(per_token_logps, completion_mask, eps_low, eps_high)
    return seq_mean[valid].mean() if valid.any() else seq_mean.sum() * 0.0


def unlearning_sequence_terms(
    per_token_logps: torch.Tensor, completion_mask: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-sequence terms of :func:`unlearning_loss`: ``(mean_tok -log(1 - clip(p)), has_tokens)`` for each row
    (so that a batch spread over processes can be averaged over all of its sequences)."""
    if not (0.0 <= eps_low < 1.0 - eps_high <= 1.0):
        raise ValueError(f"need 0 <= eps_low < 1 - eps_high <= 1, got eps_low={eps_low}, eps_high={eps_high}")
    per_token_logps = at_least_float32(per_token_logps)
    mask = completion_mask.to(per_token_logps.dtype)
    p = torch.exp(per_token_logps).clamp(eps_low, 1.0 - eps_high)
    per_token = -torch.log1p(-p)
    lengths = mask.sum(-1)
    return (per_token * mask).sum(-1) / lengths.clamp(min=1.0), lengths > 0


VLLM_IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def vllm_importance_sampling_ratio(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> torch.Tensor:
    """Sampler/trainer mismatch correction of rows generated by vLLM: ``rho = pi_trainer / pi_sampler``.

    Mirrors TRL 1.16's ``GRPOTrainer._generate_and_score_completions`` (``vllm_importance_sampling_ratio``), which
    computes it inline with ``GRPOConfig.vllm_importance_sampling_mode`` / ``_clip_min`` / ``_clip_max`` (defaults
    here: TRL's): ``d = (old_logps - sampling_logps) * mask``, a NaN sampling log-prob (vLLM could not score the token)
    gives ``d = 0``; ``token_*``: ``rho = exp(d)`` per token, shape (B, T); ``sequence_*``: ``rho = exp(sum_t d)``,
    shape (B, 1); ``*_truncate`` clamps rho to ``[clip_min, clip_max]``, ``*_mask`` sets rho outside that range to 0
    (a ``None`` bound is no bound). TRL multiplies the per-token loss by rho.

    ``old_logps`` must be the log-probs, under the trainer's forward, of the *weights that sampled the row*: for
    GRPO the policy; for EEPO's stage-2 rows the temporarily unlearned weights the engine held (docs/eepo.md).
    """
    if mode not in VLLM_IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"vllm_importance_sampling_mode must be one of {VLLM_IMPORTANCE_SAMPLING_MODES}, got {mode!r}")
    diff = torch.nan_to_num((at_least_float32(old_logps) - at_least_float32(sampling_logps)) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return ratio if clip_min is None and clip_max is None else torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


# --------------------------------------------------------------------------------------------------- DPH-RL ---
DIVERGENCES = ("forward_kl", "reverse_kl", "js", "alpha", "forward_kl_k3")


def f_divergence(log_ratio: torch.Tensor, divergence: str = "js", alpha: float = 0.2) -> torch.Tensor:
    """DPH-RL generator ``f(u)``, eq. (6) and Table 5, elementwise with ``u = exp(log_ratio)``,
    ``log_ratio = log pi_theta - log pi_ref`` on stored reference tokens (p = pi_theta, q = pi_ref):

    ===============  =====================================================
    forward_kl       ``f(u) = -log u``
    reverse_kl       ``f(u) = u log u``
    js               ``f(u) = (u log u)/2 - ((u+1)/2) log((u+1)/2)``
    alpha            ``f(u) = (u^(1-a) - (1-a) u - a) / (a (a-1))``, a not in {0, 1}
    forward_kl_k3    ``f(u) = u - log u - 1`` (the authors' code; same expectation as forward_kl under pi_ref)
    ===============  =====================================================

    All satisfy ``f(1) = 0``. ``u`` is not clipped.
    """
    log_ratio = at_least_float32(log_ratio)
    if divergence == "forward_kl":
        return -log_ratio
    u = torch.exp(log_ratio)
    if divergence == "reverse_kl":
        return u * log_ratio
    if divergence == "js":
        half = (u + 1.0) / 2.0
        return 0.5 * u * log_ratio - half * torch.log(half)
    if divergence == "alpha":
        if alpha in (0.0, 1.0):
            raise ValueError("alpha-divergence needs alpha not in {0, 1} (those limits are the KL divergences)")
        # the numerator rewritten with expm1 so that it keeps its digits next to alpha = 0 or 1, where it and the
        # denominator both vanish (written as above, float32 gave a constant 1 at alpha = 1e-9: no gradient)
        if alpha < 0.5:  # u (u^-a - 1) + a (u - 1)
            top = u * torch.expm1(-alpha * log_ratio) + alpha * torch.expm1(log_ratio)
        else:  # (u^(1-a) - 1) - (1-a) (u - 1)
            top = torch.expm1((1.0 - alpha) * log_ratio) - (1.0 - alpha) * torch.expm1(log_ratio)
        return top / (alpha * (alpha - 1.0))
    if divergence == "forward_kl_k3":
        return u - log_ratio - 1.0
    raise ValueError(f"divergence must be one of {DIVERGENCES}, got {divergence!r}")


def js_definition_terms(log_ratio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DPH-RL App. F, eq. 14-17: per-token sample estimates of the two halves of JS through ``M = (pi_ref + pi)/2``,
    with ``u = exp(log_ratio) = pi / pi_ref`` at the sampled token:

    * ``KL(pi_ref || M)`` on tokens sampled from pi_ref (D_pef): ``log(pi_ref / M) = -log((1 + u) / 2)``;
    * ``KL(pi || M)`` on tokens sampled from pi (D_exp rollouts): ``log(pi / M) = log u - log((1 + u) / 2)``.

    Returns ``(ref_side, policy_side)``, both elementwise and 0 at ``u = 1``.
    """
    log_ratio = at_least_float32(log_ratio)
    log_half_sum = torch.logaddexp(log_ratio, torch.zeros_like(log_ratio)) - math.log(2.0)  # log((1 + u) / 2)
    return -log_half_sum, log_ratio - log_half_sum


def on_policy_sample_loss(values: torch.Tensor, policy_logps: torch.Tensor) -> torch.Tensor:
    """A per-token divergence estimate on tokens sampled from the policy itself, as a loss whose expected gradient is
    the divergence's: ``values + values.detach() * (logp - logp.detach())``, the same values, with the
    score-function term ``values * grad log pi`` that backpropagating ``values`` alone leaves out (the tokens'
    probability of being sampled depends on theta too). For ``KL(pi || M)`` (App. F, eq. 15) the left-out term is
    what pulls pi toward pi_ref: without it the expected gradient pointed away (a 3-token softmax, theta = [2, 0, -1],
    uniform pi_ref: [-0.066, 0.044, 0.022] against the true [0.099, -0.052, -0.048]). Per token, given the prefix
    (as ``u`` is per token); a token's effect on the later tokens' terms is not credited. Samples from a fixed
    distribution (pi_ref, D_pef) need no such term."""
    policy_logps = at_least_float32(policy_logps)
    return values + values.detach() * (policy_logps - policy_logps.detach())


# ---------------------------------------------------------------------------------------------------- A*-PO ---
def optimal_value(rewards: torch.Tensor, beta: float) -> torch.Tensor:
    """A*-PO optimal value estimate, eq. (1) with N samples from pi_ref:
    ``V_hat(x) = beta * log( (1/N) sum_i exp(r_i / beta) )`` over the last dimension, via logsumexp.

    Limits: ``beta -> 0`` gives ``max_i r_i``; ``beta -> inf`` gives ``mean_i r_i``. ``beta = inf`` is accepted
    and returns the mean exactly.
    """
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    r = rewards.double()  # float64: the beta -> inf limit needs the precision
    if math.isinf(beta):
        return r.mean(-1).to(out_dtype)
    n = r.size(-1)
    return (beta * (torch.logsumexp(r / beta, dim=-1) - math.log(n))).to(out_dtype)


def apo_loss(seq_log_ratio: torch.Tensor, rewards: torch.Tensor, values: torch.Tensor, beta: float,
             weights: torch.Tensor | None = None):
    """A*-PO stage-2 regression loss: ``mean_batch ( beta * log(pi/pi_ref)(y|x) - (r - V_hat(x)) )^2``.

    ``seq_log_ratio`` is the sequence log-ratio (sum over completion tokens). No clipping, no normalisation.
    ``weights`` (optional): the loss is ``sum_i w_i * square_i`` instead of the mean, and a row of weight 0 is left
    out (its square never enters, NaN included). The lazy stage 1 leaves out prompts without a value estimate this
    way (the full pass leaves them out of the dataset), with ``w = 1 / (rows kept per micro-batch)``.
    """
    residual = beta * at_least_float32(seq_log_ratio) - (at_least_float32(rewards) - at_least_float32(values))
    if weights is None:
        return (residual**2).mean()
    residual = torch.where(weights > 0, residual, torch.zeros_like(residual))  # before squaring: no NaN gradient
    return (residual**2 * weights).sum()
