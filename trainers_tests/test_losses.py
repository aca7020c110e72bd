"""The pure loss functions against numbers computed by hand from the papers' formulas."""

import math

import pytest
import torch

from trl_variants import losses


# ---------------------------------------------------------------------------------------------------- ERPO ---
def test_query_weights_hand_computed():
    # mean(l) = -20 -> w = -20 / l
    w = losses.query_weights(torch.tensor([-10.0, -20.0, -30.0]))
    torch.testing.assert_close(w, torch.tensor([2.0, 1.0, 2.0 / 3.0]))


def test_query_weights_carry_no_gradient_and_reject_bad_input():
    logp = torch.tensor([-3.0, -5.0], requires_grad=True)
    assert not losses.query_weights(logp).requires_grad
    with pytest.raises(ValueError, match="< 0"):
        losses.query_weights(torch.tensor([-1.0, 0.0]))
    with pytest.raises(ValueError, match="1-D"):
        losses.query_weights(torch.zeros(0))


def test_reference_query_weights_clip():
    w = losses.reference_query_weights(torch.tensor([-10.0, -40.0, -1.0]), dataset_mean=-20.0, max_weight=2.0)
    torch.testing.assert_close(w, torch.tensor([2.0, 0.5, 2.0]))  # -20/-1 = 20 clipped to 2


def test_query_kl_k3_and_k1_values():
    l_theta = torch.tensor([-11.0, -10.0, -50.0])
    l_ref = torch.tensor([-10.0, -10.0, -10.0])
    # d = l_ref - l_theta = [1, 0, 40 -> clamped to 20]
    k3 = losses.query_kl(l_theta, l_ref, "k3")
    torch.testing.assert_close(k3, torch.tensor([math.e - 2.0, 0.0, 10.0]))
    k1 = losses.query_kl(l_theta, l_ref, "k1")
    torch.testing.assert_close(k1, torch.tensor([-1.0, 0.0, -40.0]))
    with pytest.raises(ValueError, match="k3"):
        losses.query_kl(l_theta, l_ref, "k2")


def test_query_kl_gradient_flows_through_policy_only():
    l_theta = torch.tensor([-11.0], requires_grad=True)
    l_ref = torch.tensor([-10.0], requires_grad=True)
    losses.query_kl(l_theta, l_ref).sum().backward()
    # d/dl_theta (exp(d) - d - 1) with d = l_ref - l_theta  =  1 - exp(d)
    torch.testing.assert_close(l_theta.grad, torch.tensor([1.0 - math.e]))
    assert l_ref.grad is None


# ---------------------------------------------------------------------------------------------------- A*-PO ---
def test_optimal_value_hand_computed_and_limits():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    # beta = 0.5: 0.5 * log((2 e^2 + 2) / 4) = 0.5 * log((e^2 + 1) / 2)
    expected = torch.tensor([0.5 * math.log((math.e**2 + 1) / 2), 0.0, 1.0])
    torch.testing.assert_close(losses.optimal_value(r, 0.5), expected)
    torch.testing.assert_close(losses.optimal_value(r, 1e-4), torch.tensor([1.0, 0.0, 1.0]), atol=1e-3, rtol=0)
    torch.testing.assert_close(losses.optimal_value(r, 1e8), r.mean(-1), atol=1e-6, rtol=0)
    torch.testing.assert_close(losses.optimal_value(r, math.inf), r.mean(-1))
    with pytest.raises(ValueError, match="beta"):
        losses.optimal_value(r, 0.0)


# ----------------------------------------------------------------------------------------------------- EEPO ---
def test_unlearning_loss_hand_computed_with_clipping():
    eps_low, eps_high = 1e-6, 1e-3
    p = torch.tensor([[0.5, 0.9999999], [1e-9, 0.3]], dtype=torch.float64)
    logps = torch.log(p).requires_grad_(True)
    mask = torch.tensor([[1, 1], [1, 0]])
    u = losses.unlearning_loss(logps, mask, eps_low, eps_high)
    # seq 1: -log(1-0.5) and -log(1-0.999) (clipped); seq 2: -log(1-1e-6) (clipped); padding ignored
    expected = ((-math.log(0.5) - math.log(1e-3)) / 2 + -math.log(1 - 1e-6)) / 2
    assert u.item() == pytest.approx(expected, rel=1e-9)
    u.backward()
    # d/dlogp of -log(1-p) = p / (1-p) for unclipped tokens; 0 for clipped ones and padding
    torch.testing.assert_close(logps.grad, torch.tensor([[0.25 * 1.0, 0.0], [0.0, 0.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="eps_low"):
        losses.unlearning_loss(logps, mask, 0.6, 0.5)


def test_unlearning_loss_descent_lowers_probabilities():
    logps = torch.log(torch.tensor([[0.2, 0.7, 0.9]])).requires_grad_(True)
    losses.unlearning_loss(logps, torch.ones(1, 3), 1e-6, 1e-3).backward()
    assert (logps.grad > 0).all()  # a descent step (logps -= lr * grad) lowers every sampled token's log-prob


# --------------------------------------------------------------------------------------------------- DPH-RL ---
@pytest.mark.parametrize("divergence", ["forward_kl", "reverse_kl", "js", "alpha", "forward_kl_k3"])
def test_f_divergence_generators_hand_computed(divergence):
    log_u = torch.tensor([0.0, math.log(2.0), math.log(0.5)], dtype=torch.float64)
    a = 0.2
    expected = {
        # u = 1, 2, 0.5 in Table 5's generators
        "forward_kl": [0.0, -math.log(2), math.log(2)],
        "reverse_kl": [0.0, 2 * math.log(2), 0.5 * math.log(0.5)],
        "js": [0.0, math.log(2) - 1.5 * math.log(1.5), 0.25 * math.log(0.5) - 0.75 * math.log(0.75)],
        "alpha": [0.0, (2 ** 0.8 - 0.8 * 2 - 0.2) / (0.2 * -0.8), (0.5 ** 0.8 - 0.8 * 0.5 - 0.2) / (0.2 * -0.8)],
        "forward_kl_k3": [0.0, 2 - math.log(2) - 1, 0.5 - math.log(0.5) - 1],
    }[divergence]
    got = losses.f_divergence(log_u, divergence, alpha=a)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=1e-12)


def test_f_divergence_mass_covering_direction():
    # the loss falls as pi_theta moves toward the stored reference completion (log u from -1 up to 0)
    for divergence in ("forward_kl", "js", "alpha", "forward_kl_k3"):
        log_u = torch.tensor([-1.0], requires_grad=True)
        losses.f_divergence(log_u, divergence).sum().backward()
        assert log_u.grad.item() < 0, divergence
    with pytest.raises(ValueError, match="divergence"):
        losses.f_divergence(torch.zeros(1), "tv")
    with pytest.raises(ValueError, match="alpha"):
        losses.f_divergence(torch.zeros(1), "alpha", alpha=1.0)


@pytest.mark.parametrize("alpha,limit", [(1e-9, "reverse"), (1 - 1e-9, "forward"), (0.7, None), (-0.5, None)])
def test_the_alpha_divergence_keeps_its_digits_next_to_its_kl_limits(alpha, limit):
    """Written as (u^(1-a) - (1-a) u - a) / (a (a-1)), float32 gave a constant 1 at alpha = 1e-9 (no gradient) and a
    constant 0 at 1 - 1e-9; with expm1 it approaches the limits, u log u - u + 1 (a -> 0) and u - log u - 1 (a -> 1),
    and elsewhere it is the formula (computed in float64) to float32's precision: the plain formula was 0.5% off at
    log u = 0.01 for alpha = 0.7 (its three terms of about 1 cancel to 5e-5)."""
    log_u = torch.tensor([0.1, -0.1, 0.5, 0.01, -3.0, 3.0])
    got = losses.f_divergence(log_u, "alpha", alpha=alpha)
    x, u = log_u.double(), log_u.double().exp()
    expected = {"reverse": u * x - u + 1, "forward": u - x - 1,
                None: (torch.exp((1 - alpha) * x) - (1 - alpha) * u - alpha) / (alpha * (alpha - 1))}[limit]
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-7)


def test_apo_loss_hand_computed():
    # (beta * log_ratio - (r - V))^2, mean over the batch
    loss = losses.apo_loss(torch.tensor([10.0, -20.0]), torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.25]), 1e-2)
    assert loss.item() == pytest.approx(((0.1 - 0.5) ** 2 + (-0.2 + 0.25) ** 2) / 2)


def test_apo_loss_weights_leave_rows_out():
    # sum_i w_i square_i; weight 0 leaves a row out, NaN included, and its gradient is 0
    ratio = torch.tensor([10.0, -20.0, 5.0], requires_grad=True)
    rewards, values = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.5, math.nan, 1.0])
    loss = losses.apo_loss(ratio, rewards, values, 1e-2, weights=torch.tensor([0.5, 0.0, 0.5]))
    assert loss.item() == pytest.approx(((0.1 - 0.5) ** 2 + (0.05 - 0.0) ** 2) / 2)
    loss.backward()
    assert ratio.grad[1].item() == 0.0 and ratio.grad[0].item() != 0.0
    none = losses.apo_loss(ratio, rewards, values, 1e-2, weights=torch.zeros(3))
    assert none.item() == 0.0


def test_js_definition_terms_hand_computed():
    ref_side, policy_side = losses.js_definition_terms(torch.tensor([0.0, math.log(2.0), math.log(0.5)]))
    torch.testing.assert_close(ref_side, torch.tensor([0.0, -math.log(1.5), -math.log(0.75)]))
    torch.testing.assert_close(policy_side, torch.tensor([0.0, math.log(2 / 1.5), math.log(0.5 / 0.75)]))


@pytest.mark.parametrize("theta", [[2.0, 0.0, -1.0], [-1.0, 0.5, 0.3], [0.0, 0.0, 0.0]])
def test_kl_to_the_mixture_on_the_policys_own_samples_has_the_divergences_gradient(theta):
    """App. F's beta1 * KL(pi || M) on D_exp, estimated on tokens sampled from pi: the expected gradient of the loss
    (exact expectation over a 3-token softmax) is the gradient of KL(pi || M) itself, computed here from its
    definition. Backpropagating the per-token value alone pointed the other way at theta = [2, 0, -1]."""
    ref = torch.tensor([0.5, 0.2, 0.3])
    theta = torch.tensor(theta, requires_grad=True)
    pi = torch.softmax(theta, 0)
    mixture = (pi + ref) / 2
    (truth,) = torch.autograd.grad((pi * (pi.log() - mixture.log())).sum(), theta)
    logps = torch.log_softmax(theta, 0)
    _, per_token = losses.js_definition_terms(logps - ref.log())
    loss = losses.on_policy_sample_loss(per_token, logps)
    torch.testing.assert_close(loss, per_token)  # the same values: what is logged and summed does not change
    (expected,) = torch.autograd.grad((pi.detach() * loss).sum(), theta)  # E_{x ~ pi}[grad loss(x)]
    torch.testing.assert_close(expected, truth, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------------- low-precision inputs ---
def _bf16(*values):
    return torch.tensor(values, dtype=torch.bfloat16)


def test_unlearning_terms_of_bf16_log_probs_are_finite_with_the_float32_clip():
    # a token of probability ~1 in bf16: p clipped to 1 - 1e-3, which bf16 rounds to 1 (-log(1 - 1) = inf); in
    # float32 the clip holds and the term is -log(1e-3). (FSDP's bf16 mixed precision handed EEPO such log-probs.)
    logps = _bf16(-0.0005, math.log(0.5)).reshape(1, 2).requires_grad_(True)
    terms, has_tokens = losses.unlearning_sequence_terms(logps, torch.ones(1, 2), 1e-6, 1e-3)
    assert terms.dtype == torch.float32 and has_tokens.tolist() == [True]
    expected = (-math.log(1e-3) - math.log(1 - math.exp(float(logps[0, 1])))) / 2
    assert terms.item() == pytest.approx(expected, rel=1e-5)
    terms.sum().backward()
    assert torch.isfinite(logps.grad).all() and logps.grad.dtype == torch.bfloat16


def test_query_kl_of_bf16_log_probs_does_not_cancel_to_noise():
    # k3 = exp(d) - d - 1 at d = 2^-7 is ~3.1e-5; in bf16 exp(d) rounds to 1 + 2^-7 and k3 comes out 0
    policy, ref = _bf16(-0.5), _bf16(-0.5 + 2.0**-7)  # both exact in bf16
    kl = losses.query_kl(policy, ref, "k3")
    d = 2.0**-7
    assert kl.dtype == torch.float32 and kl.item() == pytest.approx(math.exp(d) - d - 1, rel=1e-2)  # float32: ~0.1%


@pytest.mark.parametrize("name", ["f_divergence", "js_definition_terms", "apo_loss", "vllm_importance_sampling_ratio"])
def test_low_precision_inputs_are_computed_in_float32(name):
    log_ratio = _bf16(0.0078125, -0.25, 1.5)
    calls = {
        "f_divergence": lambda t: losses.f_divergence(t, "js"),
        "js_definition_terms": lambda t: torch.stack(losses.js_definition_terms(t)),
        "apo_loss": lambda t: losses.apo_loss(t, t.new_tensor([1.0, 0.0, 1.0]), t.new_tensor([0.5, 0.25, 0.75]),
                                              1e-2),
        "vllm_importance_sampling_ratio": lambda t: losses.vllm_importance_sampling_ratio(
            t.reshape(1, 3), torch.zeros(1, 3, dtype=t.dtype), torch.ones(1, 3), "token_truncate"),
    }
    got = calls[name](log_ratio)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, calls[name](log_ratio.float()), rtol=0, atol=0)  # the same values, upcast first
    double = calls[name](log_ratio.double())
    assert double.dtype == torch.float64  # float64 is not rounded down
