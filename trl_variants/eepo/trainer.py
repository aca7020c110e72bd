"""EEPO: two-stage sample-then-forget rollouts (EEPO paper, arXiv 2510.05837, Sec. 3, Algorithm 1; docs/algorithms.md).

For each group of G completions, inside GRPO's generation step (``_generate_single_turn``):

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
from trl import GRPOTrainer
from trl.trainer.utils import nanmax, nanmin

from .. import losses
from .._card import ModelCardMixin
from .._checkpoint import CheckpointStateMixin
from .._citations import EEPO, paper
from .._common import FiniteLossMixin, resolve_config
from .._validation import check_train_dataset, checked_reward_funcs
from ..generation import pack_prompt_completion
from .config import EEPOConfig


class EEPOTrainer(CheckpointStateMixin, ModelCardMixin, FiniteLossMixin, GRPOTrainer):
    """Exploration-Enhanced Policy Optimization. Takes GRPOTrainer's arguments; see [`EEPOConfig`]."""

    _tag_names = ["trl", "grpo", "eepo"]
    _name = "EEPO"
    _paper = paper("EEPO: Exploration-Enhanced Policy Optimization via Sample-Then-Forget", "2510.05837", EEPO)

    def __init__(self, model, reward_funcs=None, args: EEPOConfig | None = None, train_dataset=None,
                 eval_dataset=None, **kwargs):
        args = resolve_config(model, args, EEPOConfig, "EEPO")
        check_train_dataset(train_dataset, "EEPOTrainer")  # before GRPOTrainer loads the model
        for unsupported in ("tools", "environment_factory", "rollout_func"):
            if kwargs.get(unsupported) is not None:
                raise ValueError(f"EEPOTrainer does not support {unsupported}= (two-stage rollouts are single-turn)")
        reward_funcs = checked_reward_funcs(reward_funcs)  # a bad reward value is refused naming the function
        super().__init__(model, reward_funcs, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                         **kwargs)
        if args.entropy_gate != "never" and (self.is_deepspeed_enabled and self.accelerator.state.deepspeed_plugin
                                             .zero_stage == 3 or self.is_fsdp_enabled):
            raise ValueError("EEPO's unlearning step edits full parameters in place: it supports DDP, ZeRO-1/2 and "
                             "PEFT, not ZeRO-3 or FSDP (use zero2.yaml, or entropy_gate='never')")
        self._entropy_history: collections.deque[float] = collections.deque(maxlen=args.entropy_window)
        self._pending_old_logps: list[list[float]] | None = None  # per row, set by an unlearning rollout
        self._pending_stage2: list[int] | None = None  # that rollout's stage-2 rows

    # ------------------------------------------------------------------------------------ checkpoint state ---
    def _extra_state(self) -> dict:
        return {"entropy_history": list(self._entropy_history)}

    def _load_extra_state(self, state: dict) -> None:
        self._entropy_history = collections.deque(state["entropy_history"], maxlen=self.args.entropy_window)

    # ------------------------------------------------------------------------------------------ the rollout ---
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        self._pending_old_logps = self._pending_stage2 = None
        if not self.model.training or self.args.entropy_gate == "never":
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)
        if images is not None or multimodal_fields:
            raise ValueError("EEPOTrainer supports text-only models")
        G = self.num_generations
        k1 = (G + 1) // 2  # stage 1 takes the larger half when G is odd (it also feeds the entropy gate)
        k2 = G - k1
        stage1 = [i for i in range(len(prompt_ids)) if i % G < k1]
        stage2 = [i for i in range(len(prompt_ids)) if i % G >= k1]
        p1, p2 = [prompt_ids[i] for i in stage1], [prompt_ids[i] for i in stage2]

        # 1. stage 1 from the current policy (k1 consecutive copies of each prompt, as vLLM server mode expects)
        c1, lp1 = super()._generate_single_turn(p1, None, {}, k1)
        model = self.accelerator.unwrap_model(self.model)
        # 2. entropy gate (one forward with grad: its log-probs also feed the unlearning loss)
        with torch.enable_grad():
            logps1, ent1, mask1 = self._score(model, p1, c1, entropy=True)
        h_t = self._global_mean(ent1.detach(), mask1)
        self._entropy_history.append(h_t)
        h_bar = sum(self._entropy_history) / len(self._entropy_history)
        unlearn = self.args.entropy_gate == "always" or h_bar < self.args.entropy_threshold
        metrics = self._metrics["train"]
        metrics["eepo/entropy_stage1"].append(h_t)
        metrics["eepo/entropy_moving_avg"].append(h_bar)
        metrics["eepo/gate"].append(float(unlearn))
        if not unlearn:
            c2, lp2 = super()._generate_single_turn(p2, None, {}, k2)
            return self._interleave(stage1, stage2, c1, c2, lp1, lp2)

        # 3. one plain gradient step on the rollout weights, lowering p(stage-1 tokens): the gradient of the loss
        #    over ALL stage-1 sequences of the global batch (mean over sequences), summed over processes, so that
        #    every process holds the same unlearned model
        params = [p for p in model.parameters() if p.requires_grad]
        snapshot = [p.detach().clone() for p in params]
        seq_terms, has_tokens = losses.unlearning_sequence_terms(
            logps1, mask1, self.args.unlearning_eps_low, self.args.unlearning_eps_high)
        n_sequences = self.accelerator.reduce(has_tokens.sum().to(seq_terms.dtype).detach(), "sum").clamp(min=1.0)
        u = (seq_terms * has_tokens).sum() / n_sequences  # this process's share of the global mean
        grads = [g if g is None else self.accelerator.reduce(g, "sum")
                 for g in torch.autograd.grad(u, params, allow_unused=True)]
        before1 = logps1.detach()  # stage-1 log-probs under the policy: the stage-1 old log-probs
        del logps1
        try:
            with torch.no_grad():
                for p, g in zip(params, grads, strict=True):
                    if g is not None:
                        p.sub_(self.args.unlearning_lr * g)
            del grads
            self._sync_vllm()
            # 4. stage 2 from the unlearned rollout model, scored under it (its old log-probs and entropy); on
            #    rollouts that will be logged the same forward also re-scores stage 1 (how much the step lowered it)
            c2, lp2 = super()._generate_single_turn(p2, None, {}, k2)
            measure_drop = self._rollout_is_logged()
            rescored_p, rescored_c = (p2 + p1, c2 + c1) if measure_drop else (p2, c2)
            with torch.no_grad():
                after, ent, mask = self._score(model, rescored_p, rescored_c, entropy=True)
        finally:
            # 5. restore, bit for bit
            with torch.no_grad():
                for p, saved in zip(params, snapshot, strict=True):
                    p.copy_(saved)
            self._sync_vllm()
        n2 = len(p2)  # rows [:n2] are stage 2 (columns past their own completions are masked out)
        old2, mask2, ent2 = after[:n2], mask[:n2], ent[:n2]
        metrics["eepo/unlearning_loss"].append(self.accelerator.reduce(u.detach(), "sum").item())
        metrics["eepo/entropy_stage2"].append(self._global_mean(ent2, mask2))
        if measure_drop:
            after1 = after[n2:, : mask1.size(1)]
            drop = ((after1 - before1) * mask1).sum(-1)
            metrics["eepo/stage1_logp_change"].append(self.accelerator.gather(drop).mean().item())
        # old log-probs: stage 1 under the policy (= the pre-step weights), stage 2 under the unlearned weights
        rows1 = [lp[m.bool()].tolist() for lp, m in zip(before1, mask1, strict=True)]
        rows2 = [lp[m.bool()].tolist() for lp, m in zip(old2, mask2, strict=True)]
        self._pending_old_logps = self._interleave(stage1, stage2, rows1, rows2, None, None)[0]
        self._pending_stage2 = stage2
        return self._interleave(stage1, stage2, c1, c2, lp1, lp2)

    def _generate_and_score_completions(self, inputs):
        """GRPO's scoring, then each row's old log-probs (and, with vLLM, its sampler/trainer correction) taken
        against the weights that sampled it: stage 1 the policy (TRL's own values), stage 2 the unlearned model."""
        self._pending_old_logps = self._pending_stage2 = None
        output = super()._generate_and_score_completions(inputs)
        rows, stage2 = self._pending_old_logps, self._pending_stage2
        self._pending_old_logps = self._pending_stage2 = None
        if rows is None:  # no unlearning step: every row came from the policy, TRL's output is right as is
            return output
        old = torch.zeros_like(output["completion_ids"], dtype=torch.float32)
        for i, r in enumerate(rows):
            old[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
        if output.get("old_per_token_logps") is not None:  # TRL scored every row under the policy: keep stage 1
            trl_old, idx = output["old_per_token_logps"], torch.tensor(stage2, device=old.device)
            trl_old[idx] = old[idx].to(trl_old.dtype)
            old = trl_old
        output["old_per_token_logps"] = old
        if "importance_sampling_ratio" in output:  # vLLM: stage 2 was sampled by the engine holding unlearned weights
            self._correct_stage2_sampling(output, stage2)
        return output

    def _correct_stage2_sampling(self, output, stage2):
        """vLLM's sampler/trainer correction of the stage-2 rows, against the model that sampled them.

        TRL computed ``exp(old - sampling)`` with ``old`` under the policy for every row. Stage 1 was sampled by the
        engine holding the policy: TRL's ratio stays. Stage 2 was sampled by the engine holding the unlearned
        weights, so its ratio is recomputed from its old log-probs under those weights (same mode and bounds,
        ``losses.vllm_importance_sampling_ratio``), and TRL's ``sampling/*`` metrics are recomputed to describe the
        ratios actually applied (same definitions and cross-process aggregation as TRL's)."""
        idx = torch.tensor(stage2, device=output["completion_mask"].device)
        old, sampling, mask = output["old_per_token_logps"], output["sampling_per_token_logps"], output["completion_mask"]
        ratio = output["importance_sampling_ratio"]
        ratio[idx] = losses.vllm_importance_sampling_ratio(
            old[idx], sampling[idx], mask[idx], self.vllm_importance_sampling_mode,
            self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max).to(ratio.dtype)

        def min_mean_max(x):
            return torch.stack([x.min(), x.mean(), x.max()]) if x.numel() else torch.zeros(3, device=x.device)

        delta = (old - sampling).abs()[mask.bool()]
        sequence_level = self.vllm_importance_sampling_mode.startswith("sequence")
        stats = torch.cat([min_mean_max(delta[~delta.isnan()]),
                           min_mean_max(ratio.flatten() if sequence_level else ratio[mask.bool()])])
        stats = self.accelerator.gather(stats[None].float()).view(-1, 6)  # one row per process
        metrics = self._metrics["train"]
        for name, value in (("sampling/sampling_logp_difference/mean", stats[:, 1].mean()),
                            ("sampling/sampling_logp_difference/max", stats[:, 2].max()),
                            ("sampling/importance_sampling_ratio/min", nanmin(stats[:, 3])),
                            ("sampling/importance_sampling_ratio/mean", stats[:, 4].nanmean()),
                            ("sampling/importance_sampling_ratio/max", nanmax(stats[:, 5]))):
            metrics[name][-1] = value.item()  # TRL appended this rollout's value last

    # --------------------------------------------------------------------------------------------- helpers ---
    def _score(self, model, prompts, completions, entropy=False):
        """Per-token log-probs (and entropies) of ``completions`` given ``prompts`` under ``model``."""
        device = self.accelerator.device
        ids, attn, P = pack_prompt_completion(prompts, completions, self.processing_class.pad_token_id)
        logps, ent, _ = self._get_per_token_logps_and_entropies(
            model, ids.to(device), attn.to(device), ids.size(1) - P, batch_size=self.args.per_device_train_batch_size,
            compute_entropy=entropy)
        return logps, ent, attn[:, P:].to(device)

    def _rollout_is_logged(self) -> bool:
        """Whether a log falls within the optimizer steps this rollout feeds. Re-scoring stage 1 under the unlearned
        weights only feeds a metric, so it is done on those rollouts only (the same decision on every process)."""
        args = self.args
        if args.logging_strategy != "steps":
            return True
        every = int(args.logging_steps if args.logging_steps >= 1 else self.state.logging_steps)
        step = self.state.global_step
        fed = max(1, args.steps_per_generation * args.num_iterations // args.gradient_accumulation_steps)
        return (args.logging_first_step and step == 0) or any((step + k) % every == 0 for k in range(1, fed + 1))

    def _global_mean(self, values, mask) -> float:
        totals = self.accelerator.reduce(torch.stack([(values * mask).sum(), mask.sum().to(values.dtype)]), "sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()

    @staticmethod
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

    def _sync_vllm(self):
        if self.use_vllm:
            self.vllm_generation.sync_weights()
