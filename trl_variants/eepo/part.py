"""EEPO's addition to GRPO, as a part: two-stage sample-then-forget rollouts (EEPO paper, arXiv 2510.05837, Sec. 3,
Algorithm 1; docs/algorithms.md).

For each group of G completions, in place of GRPO's sampling of the batch (the part owns the rollout):

1. sample ceil(G/2) completions per prompt from the rollout model (= current policy);
2. measure their mean token entropy H_t; H_bar = mean of the last m values (eq. 4-5);
3. if H_bar < alpha: ONE plain gradient step (lr eta, no momentum) on the rollout weights that lowers the probability
   of the stage-1 tokens, minimising ``mean_seq mean_tok -log(1 - clip(p, eps_L, 1 - eps_R))`` (eq. 7-11);
4. sample the other floor(G/2) completions from the updated rollout model, and score them under it (their old log-probs;
   on rollouts that will be logged, stage 1 is re-scored in the same forward to report how much the step lowered it);
5. restore the weights bit for bit; then GRPO's update on all G completions as usual, each row's old log-probs (and,
   with vLLM, its sampler/trainer importance-sampling correction) taken against the weights that sampled it.

The temporary gradient is taken with ``torch.autograd.grad`` on the unwrapped module (nothing is accumulated into
``.grad``, no DDP hook fires, the optimizer never sees it), of this process's share of the mean over ALL stage-1
sequences of the global batch, and summed over processes: every process applies the same step (docs/distributed.md).
"""

from __future__ import annotations

import collections

import torch
from trl.trainer.utils import nanmax, nanmin

from .. import losses
from .._model import params_sharded
from ..parts import Part
from .losses import vllm_importance_sampling_ratio


def _interleave(idx1, idx2, a1, a2, b1, b2):
    n = len(idx1) + len(idx2)
    a, b = [None] * n, None if b1 is None or b2 is None else [None] * n
    for k, i in enumerate(idx1):
        a[i] = a1[k]
        if b is not None:
            b[i] = b1[k]
    for k, i in enumerate(idx2):
        a[i] = a2[k]
        if b is not None:
            b[i] = b2[k]
    return a, b


def _rollout_is_logged(trainer) -> bool:
    """Whether a log falls within the optimizer steps this rollout feeds. Re-scoring stage 1 under the unlearned
    weights only feeds a metric, so it is done on those rollouts only (the same decision on every process)."""
    args = trainer.args
    if args.logging_strategy != "steps":
        return True
    every = int(args.logging_steps if args.logging_steps >= 1 else trainer.state.logging_steps)
    step = trainer.state.global_step
    fed = max(1, args.steps_per_generation * args.num_iterations // args.gradient_accumulation_steps)
    return (args.logging_first_step and step == 0) or any((step + k) % every == 0 for k in range(1, fed + 1))


class TwoStageRollout(Part):
    """The rollout of eq. 4-11. The trainer holds the gate's state ``_entropy_history`` (checkpointed) and, between
    the rollout and its scoring, ``_pending_old_logps`` / ``_pending_stage2``. Metrics: ``eepo/entropy_stage1``,
    ``eepo/entropy_moving_avg``, ``eepo/gate``, ``eepo/unlearning_loss``, ``eepo/entropy_stage2``,
    ``eepo/stage1_logp_change``."""

    name = "eepo_two_stage_rollout"
    owns_rollout = True

    def check(self, trainer_name, args, train_dataset, kwargs) -> None:
        for unsupported in ("tools", "environment_factory", "rollout_func"):
            if kwargs.get(unsupported) is not None:
                raise ValueError(f"{trainer_name} does not support {unsupported}= (two-stage rollouts are single-turn)")

    def setup(self, trainer) -> None:
        args = trainer.args
        if args.entropy_gate != "never" and params_sharded(trainer):
            raise ValueError("EEPO's unlearning step edits full parameters in place: it supports DDP, ZeRO-1/2 and "
                             "PEFT, not ZeRO-3 or FSDP (use zero2.yaml, or entropy_gate='never')")
        trainer._entropy_history = collections.deque(maxlen=args.entropy_window)
        trainer._pending_old_logps = None  # per row, set by an unlearning rollout
        trainer._pending_stage2 = None  # that rollout's stage-2 rows
        self.trainer = trainer

    # ------------------------------------------------------------------------------------ checkpoint state ---
    def state(self) -> dict:
        return {"entropy_history": list(self.trainer._entropy_history)}

    def load_state(self, state: dict) -> None:
        self.trainer._entropy_history = collections.deque(state["entropy_history"],
                                                          maxlen=self.trainer.args.entropy_window)

    # ------------------------------------------------------------------------------------------ the rollout ---
    def generate(self, trainer, grpo_generate, prompt_ids, images, multimodal_fields, num_generations,
                 has_tool_images=False):
        trainer._pending_old_logps = trainer._pending_stage2 = None
        if not trainer.model.training or trainer.args.entropy_gate == "never":
            return grpo_generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        if images is not None or multimodal_fields:
            raise ValueError("EEPOTrainer supports text-only models")
        G = trainer.num_generations
        k1 = (G + 1) // 2  # stage 1 takes the larger half when G is odd (it also feeds the entropy gate)
        k2 = G - k1
        stage1 = [i for i in range(len(prompt_ids)) if i % G < k1]
        stage2 = [i for i in range(len(prompt_ids)) if i % G >= k1]
        p1, p2 = [prompt_ids[i] for i in stage1], [prompt_ids[i] for i in stage2]

        # 1. stage 1 from the current policy (k1 consecutive copies of each prompt, as vLLM server mode expects)
        c1, lp1 = grpo_generate(p1, None, {}, k1)
        model = trainer.accelerator.unwrap_model(trainer.model)
        # 2. entropy gate (one forward with grad: its log-probs also feed the unlearning loss)
        with torch.enable_grad():
            logps1, ent1, mask1 = trainer._score(model, p1, c1, entropy=True)
        h_t = trainer._global_mean(ent1.detach(), mask1)
        trainer._entropy_history.append(h_t)
        h_bar = sum(trainer._entropy_history) / len(trainer._entropy_history)
        unlearn = trainer.args.entropy_gate == "always" or h_bar < trainer.args.entropy_threshold
        metrics = trainer._metrics["train"]
        metrics["eepo/entropy_stage1"].append(h_t)
        metrics["eepo/entropy_moving_avg"].append(h_bar)
        metrics["eepo/gate"].append(float(unlearn))
        if not unlearn:
            c2, lp2 = grpo_generate(p2, None, {}, k2)
            return _interleave(stage1, stage2, c1, c2, lp1, lp2)

        # 3. one plain gradient step on the rollout weights, lowering p(stage-1 tokens): the gradient of the loss
        #    over ALL stage-1 sequences of the global batch (mean over sequences), summed over processes, so that
        #    every process holds the same unlearned model
        params = [p for p in model.parameters() if p.requires_grad]
        snapshot = [p.detach().clone() for p in params]
        seq_terms, has_tokens = losses.unlearning_sequence_terms(
            logps1, mask1, trainer.args.unlearning_eps_low, trainer.args.unlearning_eps_high)
        n_sequences = trainer.accelerator.reduce(has_tokens.sum().to(seq_terms.dtype).detach(), "sum").clamp(min=1.0)
        u = (seq_terms * has_tokens).sum() / n_sequences  # this process's share of the global mean
        grads = [g if g is None else trainer.accelerator.reduce(g, "sum")
                 for g in torch.autograd.grad(u, params, allow_unused=True)]
        before1 = logps1.detach()  # stage-1 log-probs under the policy: the stage-1 old log-probs
        del logps1
        try:
            with torch.no_grad():
                for p, g in zip(params, grads, strict=True):
                    if g is not None:
                        p.sub_(trainer.args.unlearning_lr * g)
            del grads
            trainer._sync_vllm()
            # 4. stage 2 from the unlearned rollout model, scored under it (its old log-probs and entropy); on
            #    rollouts that will be logged the same forward also re-scores stage 1 (how much the step lowered it)
            c2, lp2 = grpo_generate(p2, None, {}, k2)
            measure_drop = _rollout_is_logged(trainer)
            rescored_p, rescored_c = (p2 + p1, c2 + c1) if measure_drop else (p2, c2)
            with torch.no_grad():
                after, ent, mask = trainer._score(model, rescored_p, rescored_c, entropy=True)
        finally:
            # 5. restore, bit for bit
            with torch.no_grad():
                for p, saved in zip(params, snapshot, strict=True):
                    p.copy_(saved)
            trainer._sync_vllm()
        n2 = len(p2)  # rows [:n2] are stage 2 (columns past their own completions are masked out)
        old2, mask2, ent2 = after[:n2], mask[:n2], ent[:n2]
        metrics["eepo/unlearning_loss"].append(trainer.accelerator.reduce(u.detach(), "sum").item())
        metrics["eepo/entropy_stage2"].append(trainer._global_mean(ent2, mask2))
        if measure_drop:
            after1 = after[n2:, : mask1.size(1)]
            drop = ((after1 - before1) * mask1).sum(-1)
            metrics["eepo/stage1_logp_change"].append(trainer.accelerator.gather(drop).mean().item())
        # old log-probs: stage 1 under the policy (= the pre-step weights), stage 2 under the unlearned weights
        rows1 = [lp[m.bool()].tolist() for lp, m in zip(before1, mask1, strict=True)]
        rows2 = [lp[m.bool()].tolist() for lp, m in zip(old2, mask2, strict=True)]
        trainer._pending_old_logps = _interleave(stage1, stage2, rows1, rows2, None, None)[0]
        trainer._pending_stage2 = stage2
        return _interleave(stage1, stage2, c1, c2, lp1, lp2)

    def after_rollout(self, trainer, inputs, output) -> None:
        """Each row's old log-probs (and, with vLLM, its sampler/trainer correction) taken against the weights that
        sampled it: stage 1 the policy (TRL's own values), stage 2 the unlearned model."""
        rows, stage2 = trainer._pending_old_logps, trainer._pending_stage2
        trainer._pending_old_logps = trainer._pending_stage2 = None
        if rows is None:  # no unlearning step: every row came from the policy, TRL's output is right as is
            return
        old = torch.zeros_like(output["completion_ids"], dtype=torch.float32)
        for i, r in enumerate(rows):
            old[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
        if output.get("old_per_token_logps") is not None:  # TRL scored every row under the policy: keep stage 1
            trl_old, idx = output["old_per_token_logps"], torch.tensor(stage2, device=old.device)
            trl_old[idx] = old[idx].to(trl_old.dtype)
            old = trl_old
        output["old_per_token_logps"] = old
        if "importance_sampling_ratio" in output:  # vLLM: stage 2 was sampled by the engine holding unlearned weights
            self._correct_stage2_sampling(trainer, output, stage2)

    def _correct_stage2_sampling(self, trainer, output, stage2):
        """vLLM's sampler/trainer correction of the stage-2 rows, against the model that sampled them.

        TRL computed ``exp(old - sampling)`` with ``old`` under the policy for every row. Stage 1 was sampled by the
        engine holding the policy: TRL's ratio stays. Stage 2 was sampled by the engine holding the unlearned
        weights, so its ratio is recomputed from its old log-probs under those weights (same mode and bounds,
        ``eepo.losses.vllm_importance_sampling_ratio``), and TRL's ``sampling/*`` metrics are recomputed to describe the
        ratios actually applied (same definitions and cross-process aggregation as TRL's)."""
        idx = torch.tensor(stage2, device=output["completion_mask"].device)
        old, sampling, mask = output["old_per_token_logps"], output["sampling_per_token_logps"], output["completion_mask"]
        ratio = output["importance_sampling_ratio"]
        ratio[idx] = vllm_importance_sampling_ratio(
            old[idx], sampling[idx], mask[idx], trainer.vllm_importance_sampling_mode,
            trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max).to(ratio.dtype)

        def min_mean_max(x):
            return torch.stack([x.min(), x.mean(), x.max()]) if x.numel() else torch.zeros(3, device=x.device)

        delta = (old - sampling).abs()[mask.bool()]
        sequence_level = trainer.vllm_importance_sampling_mode.startswith("sequence")
        stats = torch.cat([min_mean_max(delta[~delta.isnan()]),
                           min_mean_max(ratio.flatten() if sequence_level else ratio[mask.bool()])])
        stats = trainer.accelerator.gather(stats[None].float()).view(-1, 6)  # one row per process
        metrics = trainer._metrics["train"]
        for name, value in (("sampling/sampling_logp_difference/mean", stats[:, 1].mean()),
                            ("sampling/sampling_logp_difference/max", stats[:, 2].max()),
                            ("sampling/importance_sampling_ratio/min", nanmin(stats[:, 3])),
                            ("sampling/importance_sampling_ratio/mean", stats[:, 4].nanmean()),
                            ("sampling/importance_sampling_ratio/max", nanmax(stats[:, 5]))):
            metrics[name][-1] = value.item()  # TRL appended this rollout's value last

