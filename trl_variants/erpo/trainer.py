"""ERPO: GRPO with query-weighted advantages and Query-KL (ERPO preprint Sec. 4, App. G; docs/algorithms.md).

Per step, on top of GRPOTrainer:

1. after the rollouts are scored, multiply each completion's advantage by the query weight ``w_B(s)`` of its prompt
   (eq. 8), computed from prompt log-likelihoods under stop-gradient (``_generate_and_score_completions``);
2. in the loss, add ``alpha * mean_s k3(l_ref(s) - l_theta(s))`` (eq. 10-11), reading ``l_theta(s)`` off the same
   forward pass that scores the completions (``_get_per_token_logps_and_entropies`` is asked for the prompt
   positions too) and ``l_ref(s)`` from a dataset column computed once before training. No reference model is held.
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer

from .. import losses
from .._card import ModelCardMixin
from .._checkpoint import CheckpointStateMixin
from .._citations import ERPO, paper
from .._common import (
    EvalDatasetMixin,
    FiniteLossMixin,
    OfflinePassLogMixin,
    check_presampled_model,
    check_prompt_ids,
    full_parameters,
    resolve_config,
    trainer_prompt_ids,
)
from .._data import run_on_rows
from .._validation import check_finite_column, check_train_dataset, checked_reward_funcs
from ..presample import check_presample_options
from .config import ERPOConfig
from .reference import add_reference_prompt_logps


class ERPOTrainer(CheckpointStateMixin, ModelCardMixin, FiniteLossMixin, OfflinePassLogMixin, EvalDatasetMixin,
                  GRPOTrainer):
    """Environment-Regularized Policy Optimization. Takes exactly GRPOTrainer's arguments; see [`ERPOConfig`]."""

    _tag_names = ["trl", "grpo", "erpo"]
    _name = "ERPO"
    _paper = paper(  # anonymous preprint under double-blind review: no arXiv id (the card names it, see _card.py)
        "Beyond the Stability-Exploration Dilemma: Environmental Regularization for LLM Policy Optimization",
        None, ERPO,
    )

    def __init__(self, model, reward_funcs=None, args: ERPOConfig | None = None, train_dataset=None,
                 eval_dataset=None, **kwargs):
        args = resolve_config(model, args, ERPOConfig, "ERPO")
        check_train_dataset(train_dataset, "ERPOTrainer")  # before GRPOTrainer loads the model
        reward_funcs = checked_reward_funcs(reward_funcs)  # a bad reward value is refused naming the function
        super().__init__(model, reward_funcs, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                         **kwargs)
        self._want_prompt_logps = False  # set around the loss forward when Query-KL needs l_theta(s)
        self._prompt_logps = None
        if args.needs_reference_prompt_logps:
            # l_ref(s) from the model as given (the frozen start), before any update, through the same fused kernel
            # that later yields l_theta(s), so that the Query-KL is exactly 0 at step 0.
            with self.offline_pass():
                self.train_dataset, table = run_on_rows(self.train_dataset, self._with_reference_prompt_logps,
                                                        [args.ref_prompt_logp_column], "ERPO's reference pass")
                self.prepare_eval_datasets()
            ref = torch.tensor(table[args.ref_prompt_logp_column], dtype=torch.float64)
            self._ref_prompt_logp_mean = ref.mean().item()
            self.defer_log({"ref_prompt_logp_mean": self._ref_prompt_logp_mean, "num_prompts": len(ref)})

    # ---------------------------------------------------------------------------------- reference pass (once) ---
    def _with_eval_columns(self, dataset):
        """l_ref(s) on an evaluation dataset. Without the column it is computed from the model as it is, which is the
        reference only before the first update: later, ask for the dataset at construction instead."""
        if not self.args.needs_reference_prompt_logps or dataset is None:
            return dataset
        if self.args.ref_prompt_logp_column not in (dataset.column_names or []) and self.state.global_step > 0:
            raise ValueError(
                f"ERPOTrainer.evaluate: this eval_dataset has no {self.args.ref_prompt_logp_column!r} column (the "
                "prompts' log-likelihood under the starting model, read by Query-KL and the reference query "
                f"weights), and after {self.state.global_step} optimizer steps the model no longer is that starting "
                "model. Pass the dataset as ERPOTrainer(eval_dataset=...) (a dict of several is fine), or add the "
                "column with `trl-variants presample --num_samples 0 --record_prompt_logp true`")
        return run_on_rows(dataset, self._with_reference_prompt_logps, [self.args.ref_prompt_logp_column],
                           "ERPO's reference pass")[0]

    def _with_reference_prompt_logps(self, dataset):
        column = self.args.ref_prompt_logp_column
        if dataset is None:
            return dataset
        if column in dataset.column_names:  # from `trl-variants presample`, or the user's own
            check_finite_column(dataset, column, "recompute it (drop the column and the trainer runs the reference pass)")
            check_presample_options(dataset, temperature=self.temperature)
            check_presampled_model(self, dataset)  # made by this model (its weights, in any dtype)
            check_prompt_ids(self, dataset)
            return dataset

        def fused_scorer(ids, mask):
            device = self.accelerator.device
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, ids.to(device), mask.to(device), ids.size(1) - 1
            )
            return logps

        with torch.no_grad(), full_parameters(self):
            return add_reference_prompt_logps(
                dataset, self.model, self.processing_class, column=column, temperature=self.temperature,
                batch_size=self.args.reference_batch_size, accelerator=self.accelerator, token_logps_fn=fused_scorer,
                tokenize_fn=lambda prompts: trainer_prompt_ids(self, prompts),
            )

    # ------------------------------------------------------------------------------------- step 1: weights ---
    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        args = self.args
        if args.query_kl_coef > 0:
            output["ref_prompt_logps"] = torch.tensor(
                [x[args.ref_prompt_logp_column] for x in inputs], dtype=torch.float32, device=self.accelerator.device
            )
        if args.use_query_weights:
            weights = self._query_weights(inputs, output)
            output["advantages"] = output["advantages"] * weights
            mode = "train" if self.model.training else "eval"
            all_w = self.accelerator.gather(weights)
            self._metrics[mode]["erpo/query_weight/mean"].append(all_w.mean().item())
            self._metrics[mode]["erpo/query_weight/min"].append(all_w.min().item())
            self._metrics[mode]["erpo/query_weight/max"].append(all_w.max().item())
        return output

    def _query_weights(self, inputs, output) -> torch.Tensor:
        """w_B(s) for each local row (rows of one prompt share it)."""
        device = self.accelerator.device
        if self.args.query_weight_source == "reference":
            l_ref = torch.tensor([x[self.args.ref_prompt_logp_column] for x in inputs], device=device)
            return losses.reference_query_weights(l_ref, self._ref_prompt_logp_mean, self.args.query_weight_max)
        # l(s) under the rollout weights (= current policy, stop-gradient), one forward per distinct local prompt.
        prompt_ids, prompt_mask = output["prompt_ids"], output["prompt_mask"]
        new_prompt = torch.ones(prompt_ids.size(0), dtype=torch.bool, device=device)
        new_prompt[1:] = (prompt_ids[1:] != prompt_ids[:-1]).any(-1)
        first_rows = new_prompt.nonzero().squeeze(-1)
        with torch.no_grad():
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, prompt_ids[first_rows], prompt_mask[first_rows], prompt_ids.size(1) - 1,
                batch_size=self.args.per_device_train_batch_size,
            )
        valid = prompt_mask[first_rows, 1:] * prompt_mask[first_rows, :-1]
        l_distinct = (logps * valid).sum(-1).float()
        l_rows = l_distinct[new_prompt.long().cumsum(0) - 1]  # each row takes its prompt's value
        # mean over the distinct prompts of the global batch: groups are G consecutive rows of the gathered batch
        mode = "train" if self.model.training else "eval"
        G = self.num_generations if mode == "train" else self.num_generations_eval
        l_all = self.accelerator.gather(l_rows)
        distinct = l_all[::G]
        self._metrics[mode]["erpo/prompt_logp/mean"].append(distinct.mean().item())
        w_all = losses.query_weights(distinct).repeat_interleave(G)
        rank = self.accelerator.process_index
        return w_all[rank * l_rows.numel() : (rank + 1) * l_rows.numel()]

    # -------------------------------------------------------------------------------------- step 2: the loss ---
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        if not self._want_prompt_logps:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        # Score every position but the first in the same forward, then hand GRPO the completion slice only.
        prompt_len = input_ids.size(1) - logits_to_keep
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, input_ids.size(1) - 1, *args, **kwargs
        )
        valid = attention_mask[:, 1:prompt_len] * attention_mask[:, : prompt_len - 1]
        self._prompt_logps = (logps[:, : prompt_len - 1] * valid).sum(-1)
        completion = slice(prompt_len - 1, None)
        return logps[:, completion], None if entropies is None else entropies[:, completion], aux

    def _compute_loss(self, model, inputs):
        alpha = self.args.query_kl_coef
        if alpha == 0:
            return super()._compute_loss(model, inputs)
        self._want_prompt_logps = True
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._want_prompt_logps = False
        l_theta, self._prompt_logps = self._prompt_logps, None
        per_prompt = losses.query_kl(l_theta, inputs["ref_prompt_logps"], self.args.query_kl_estimator)
        # Row mean = mean over distinct prompts when the step sees whole groups (each prompt has G rows).
        mode = "train" if self.model.training else "eval"
        scale = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        loss = loss + alpha * per_prompt.mean() / scale
        self._metrics[mode]["erpo/query_kl"].append(self.accelerator.gather(per_prompt.detach()).mean().item())
        self._metrics[mode]["erpo/policy_prompt_logp/mean"].append(
            self.accelerator.gather(l_theta.detach()).mean().item())
        return loss
