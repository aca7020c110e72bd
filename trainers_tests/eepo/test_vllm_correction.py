"""EEPO with vLLM: each stage's sampler/trainer importance-sampling correction is taken against the weights that
sampled it (stage 1: the policy, TRL's own ratio; stage 2: the temporarily unlearned model).

vLLM cannot run here (no GPU), so the CPU test puts a stand-in for TRL's ``VLLMGeneration`` where the trainer calls
it: an engine with its own copy of the weights, replaced only by ``sync_weights()`` (as vLLM's are), that samples
with them and returns the per-token sampling log-probs, shifted by a known amount per row (a sampler/trainer
mismatch of known size). Everything downstream is TRL's and EEPO's own code. The end-to-end test with real vLLM
runs only where vLLM and a GPU are present.
"""

import copy

import pytest
import torch

from trl_variants import EEPOConfig, EEPOTrainer, accuracy_reward
from trl_variants.eepo.losses import vllm_importance_sampling_ratio

from ..helpers import DEFAULT_MODEL_PATH, small_config, train_dataset

OFFSETS = [0.3, -1.5, 0.0, 0.9]  # sampler minus trainer log-prob on each row's first token, by row within a call


class StandInEngine:
    """Duck-types the two methods of TRL's ``VLLMGeneration`` that ``GRPOTrainer._generate_single_turn`` calls."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.model = copy.deepcopy(trainer.accelerator.unwrap_model(trainer.model)).eval()
        self.weights_at_generate = []  # a copy of the engine's weights at every generate call

    def sync_weights(self):
        self.model.load_state_dict(self.trainer.accelerator.unwrap_model(self.trainer.model).state_dict())

    @torch.no_grad()
    def generate(self, prompts, images, num_generations, profiler=None):
        t, pad = self.trainer, self.trainer.processing_class.pad_token_id
        self.weights_at_generate.append({n: p.clone() for n, p in self.model.named_parameters()})
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        out = self.model.generate(ids, attention_mask=attn, do_sample=True, top_k=0, top_p=1.0,
                                  temperature=t.temperature, max_new_tokens=t.max_completion_length,
                                  eos_token_id=t.eos_token_ids, pad_token_id=pad)
        completions, logprobs = [], []
        for k, (p, row) in enumerate(zip(prompts, out[:, width:].tolist(), strict=True)):
            c = row[: next((i + 1 for i, x in enumerate(row) if x in t.eos_token_ids), len(row))]
            logits = self.model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1: -1] / t.temperature
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
            lp[0] += OFFSETS[k % len(OFFSETS)]
            completions.append(c)
            logprobs.append([[x] for x in lp.tolist()])  # vLLM's layout: top-1 log-prob per token
        return prompts, completions, logprobs, None


def _plain_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """Completion log-probs under ``model``'s plain forward, one unpadded row at a time, padded like the output."""
    out = torch.zeros(completion_ids.shape)
    for i in range(len(completion_ids)):
        p, c = prompt_ids[i][prompt_mask[i].bool()], completion_ids[i][completion_mask[i].bool()]
        logits = model(input_ids=torch.cat([p, c])[None]).logits[0, len(p) - 1: -1]
        out[i, : len(c)] = torch.log_softmax(logits, -1).gather(-1, c[:, None]).squeeze(-1)
    return out


@pytest.fixture(scope="module")
def eepo(tmp_path_factory):
    """One trainer for every mode (each test sets the mode and bounds the way TRL's __init__ copies them)."""
    return EEPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, train_dataset=train_dataset(),
                       args=small_config(EEPOConfig, tmp_path_factory.mktemp("eepo"), entropy_gate="always",
                                         unlearning_lr=0.5, max_completion_length=16))


@pytest.mark.parametrize("mode", ["sequence_mask", "sequence_truncate", "token_mask", "token_truncate"])
def test_stage1_keeps_trls_correction_stage2_is_corrected_against_the_unlearned_model(eepo, mode):
    eepo.vllm_importance_sampling_mode = mode
    eepo.vllm_importance_sampling_clip_min, eepo.vllm_importance_sampling_clip_max = 0.5, 3.0
    model = eepo.model
    model.train()
    # what TRL's vLLM branch sets up in __init__ (vllm cannot be imported here)
    eepo.use_vllm, eepo._last_loaded_step = True, -1
    eepo.vllm_generation = engine = StandInEngine(eepo)
    assert eepo.vllm_importance_sampling_correction  # TRL's default
    policy = {n: p.detach().clone() for n, p in model.named_parameters()}
    G, half = eepo.num_generations, eepo.num_generations // 2
    rows = [dict(eepo.train_dataset[i]) for i in (0, 1) for _ in range(G)]
    torch.manual_seed(0)
    out = eepo._generate_and_score_completions(rows)

    # the engine sampled stage 1 with the policy, stage 2 with other (unlearned) weights, and holds the policy again
    stage1_w, stage2_w = engine.weights_at_generate
    assert all(torch.equal(stage1_w[n], policy[n]) for n in policy)
    assert not all(torch.equal(stage2_w[n], policy[n]) for n in policy)
    assert all(torch.equal(p, policy[n]) for n, p in engine.model.named_parameters())

    s1 = torch.tensor([i for i in range(len(rows)) if i % G < half])
    s2 = torch.tensor([i for i in range(len(rows)) if i % G >= half])
    old, sampling, mask = out["old_per_token_logps"], out["sampling_per_token_logps"], out["completion_mask"]
    ratio = out["importance_sampling_ratio"]
    bounds = (mode, 0.5, 3.0)
    assert ratio.shape == ((len(rows), 1) if mode.startswith("sequence") else old.shape)

    # 1. stage 1: TRL's own ratio, unchanged (and the pure function reproduces it exactly)
    torch.testing.assert_close(ratio[s1], vllm_importance_sampling_ratio(old[s1], sampling[s1], mask[s1], *bounds),
                               rtol=0, atol=0)
    # 2. every row's ratio is exp(-offset) on its first token (1 elsewhere), then truncated or masked: the engine and
    #    the trainer agree up to the known offset once each row is scored under the weights that sampled it. The
    #    tolerance covers TRL's fused LM head vs the engine's plain forward on the same weights (3e-5 measured on a
    #    sequence ratio); the unlearning shift it must tell apart moves stage-2 ratios by far more (check 3).
    offsets = torch.zeros_like(old)
    offsets[:, 0] = torch.tensor([OFFSETS[(i % G) % half + half * (i // G)] for i in range(len(rows))])
    expected = vllm_importance_sampling_ratio(torch.zeros_like(old), offsets, mask, *bounds)
    torch.testing.assert_close(ratio, expected, rtol=0, atol=1e-3)
    assert set(expected.flatten().tolist()) >= ({0.0} if mode.endswith("mask") else {3.0, 0.5})  # the bounds acted
    # 3. stage 2's old log-probs are the unlearned model's, far from the policy's: the ratio TRL alone would apply
    #    (old under the policy) is a different number, which check 2 would reject
    with torch.no_grad():
        policy_old = _plain_logps(eepo.accelerator.unwrap_model(model), out["prompt_ids"], out["prompt_mask"],
                                  out["completion_ids"], mask)
    torch.testing.assert_close(old[s1], policy_old[s1], rtol=0, atol=1e-4)
    shift = ((old[s2] - policy_old[s2]) * mask[s2]).abs().sum(-1)
    assert shift.max() > 0.1, shift
    trl_alone = vllm_importance_sampling_ratio(policy_old[s2], sampling[s2], mask[s2], *bounds)
    assert (trl_alone - ratio[s2]).abs().max() > 0.05
    # 4. TRL's sampling/* metrics describe the ratios applied
    applied = ratio.flatten() if mode.startswith("sequence") else ratio[mask.bool()]
    metrics = eepo._metrics["train"]
    assert metrics["sampling/importance_sampling_ratio/mean"][-1] == pytest.approx(applied.mean().item(), rel=1e-6)
    assert metrics["sampling/importance_sampling_ratio/min"][-1] == pytest.approx(applied.min().item(), rel=1e-6)
    assert metrics["sampling/importance_sampling_ratio/max"][-1] == pytest.approx(applied.max().item(), rel=1e-6)
    delta = (old - sampling).abs()[mask.bool()]
    assert metrics["sampling/sampling_logp_difference/max"][-1] == pytest.approx(delta.max().item(), rel=1e-6)
    assert delta.max().item() == pytest.approx(1.5, abs=1e-4)  # the largest offset, not the unlearning shift


def test_with_real_vllm_stage2_is_scored_against_the_engines_unlearned_weights(tmp_path):
    """End to end with TRL's colocated vLLM engine: the stage-2 tokens' sampling log-probs (from vLLM, which must hold
    the unlearned weights) match EEPO's stage-2 old log-probs, not the policy's, and the applied ratio is the
    correction between those two."""
    pytest.importorskip("vllm", reason="EEPO's end-to-end vLLM test needs vllm (pip install 'trl-variants[vllm]')")
    if not torch.cuda.is_available():
        pytest.skip("EEPO's end-to-end vLLM test needs a CUDA GPU (vLLM does not run on CPU here)")
    mode = "token_truncate"
    args = small_config(EEPOConfig, tmp_path, use_cpu=False, entropy_gate="always", unlearning_lr=0.5, use_vllm=True,
                        vllm_mode="colocate", vllm_gpu_memory_utilization=0.1, vllm_importance_sampling_mode=mode,
                        vllm_importance_sampling_clip_min=None, vllm_importance_sampling_clip_max=1e6)
    eepo = EEPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, args=args,
                       train_dataset=train_dataset())
    eepo.model.train()
    G, half = eepo.num_generations, eepo.num_generations // 2
    rows = [dict(eepo.train_dataset[i]) for i in (0, 1) for _ in range(G)]
    out = eepo._generate_and_score_completions(rows)
    old, sampling, mask = out["old_per_token_logps"], out["sampling_per_token_logps"], out["completion_mask"]
    torch.testing.assert_close(out["importance_sampling_ratio"],
                               vllm_importance_sampling_ratio(old, sampling, mask, mode, None, 1e6))
    s2 = torch.tensor([i for i in range(len(rows)) if i % G >= half], device=old.device)
    unwrapped = eepo.accelerator.unwrap_model(eepo.model)
    prompts = [ids[m.bool()].tolist() for ids, m in zip(out["prompt_ids"][s2], out["prompt_mask"][s2], strict=True)]
    comps = [ids[m.bool()].tolist() for ids, m in zip(out["completion_ids"][s2], mask[s2], strict=True)]
    with torch.no_grad():
        scored, _, _ = eepo._score(unwrapped, prompts, comps)
    policy2 = torch.zeros_like(old[s2])
    policy2[:, : scored.size(1)] = scored
    m2 = mask[s2].bool()
    engine_vs_unlearned = (old[s2] - sampling[s2]).abs()[m2].mean().item()
    policy_vs_unlearned = (policy2 - old[s2]).abs()[m2].mean().item()
    assert policy_vs_unlearned > 10 * engine_vs_unlearned, (policy_vs_unlearned, engine_vs_unlearned)
