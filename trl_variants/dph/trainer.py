"""DPH-RL: GRPO on exploration prompts + f-divergence rehearsal on near-perfect prompts (DPH-RL paper,
arXiv 2509.07430, Sec. 4, eq. 5-7, App. C, G; equations and defaults in docs/algorithms.md).

1. Before training (once, cached): k reference samples per training prompt and their rewards; prompts with at
   least ``pef_threshold`` correct form D_pef (their correct completions are kept with per-token reference
   log-probs), the rest D_exp (``trl_variants.presample``). A dataset made by ``trl-variants presample`` is used as
   is.
2. Each step: GRPO/PPO-clip on D_exp rollouts with no KL term (eq. 5), plus ``eta`` times the token mean of the
   generator ``f(u)``, ``u = pi_theta / pi_ref`` on a batch of stored D_pef completions (eq. 6), one loss, one
   backward (eq. 7). No reference model is loaded: pi_ref is only the stored log-probs.
Option ``divergence_form="definition"`` (App. F): JS through its definition, with a live reference model.
"""

from __future__ import annotations

import warnings

import torch
from trl import GRPOTrainer

from .. import losses
from .._card import ModelCardMixin
from .._checkpoint import CheckpointStateMixin
from .._citations import DPH, paper
from .._common import (
    FiniteLossMixin,
    OfflinePassLogMixin,
    check_presampled_model,
    check_prompt_ids,
    full_parameters,
    offline_reward_funcs,
    resolve_config,
    sampling_options,
    trainer_prompt_ids,
)
from .._data import is_stream, read_stream, stream_with_columns
from .._reference import frozen_copy_of_policy
from .._validation import check_presampled_columns, check_train_dataset, checked_reward_funcs
from ..generation import pack_prompt_completion
from ..presample import PresampleConfig, check_presample_options, presample
from ..presample.metadata import presample_metadata, summarize
from ..presample.vllm_backend import trainer_generator
from .config import DPHConfig
from .split import dph_split

_PRESAMPLE_COLUMNS = ("ref_rewards", "ref_completion_ids", "ref_completion_logps", "ref_prompt_ids")


class DPHTrainer(CheckpointStateMixin, ModelCardMixin, FiniteLossMixin, OfflinePassLogMixin, GRPOTrainer):
    """Diversity-Preserving Hybrid RL. Takes GRPOTrainer's arguments; see [`DPHConfig`]."""

    _tag_names = ["trl", "grpo", "dph-rl"]
    _capture_policy_logps = False  # set around GRPO's loss forward in the definition form
    _name = "DPH-RL"
    _paper = paper("The Choice of Divergence: A Neglected Key to Mitigating Diversity Collapse in Reinforcement "
                   "Learning with Verifiable Reward", "2509.07430", DPH)

    def __init__(self, model, reward_funcs=None, args: DPHConfig | None = None, train_dataset=None,
                 eval_dataset=None, **kwargs):
        args = resolve_config(model, args, DPHConfig, "DPH")
        if train_dataset is None:
            raise ValueError("DPHTrainer needs a train_dataset (prompts, or the output of trl-variants presample)")
        check_train_dataset(train_dataset, "DPHTrainer")  # before GRPOTrainer loads the model
        check_presampled_columns(train_dataset, _PRESAMPLE_COLUMNS, "DPHTrainer",
                                 f"--num_samples {args.num_presamples} --record_completion_logps true")
        definition = args.divergence_form == "definition"
        reward_funcs = checked_reward_funcs(reward_funcs)  # a bad reward value is refused naming the function
        super().__init__(model, reward_funcs, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                         **kwargs)
        if definition:  # App. F needs a live reference: the frozen start (the disabled adapter under PEFT)
            from peft import PeftModel

            if not isinstance(self.accelerator.unwrap_model(self.model), PeftModel):
                self.ref_model = frozen_copy_of_policy(self)
        with self.offline_pass():  # a stream is read once, in full: the split needs every prompt
            rows = read_stream(train_dataset, "DPH-RL's offline pass") if is_stream(train_dataset) else train_dataset
            presampled = self._presampled(rows)
            reward_index = self._correctness_index(presampled)
            split = dph_split(presampled, args.pef_threshold, args.pef_keep,
                              self._refinement_rewards(rows, reward_index) if args.pef_refine else None,
                              reward_index=reward_index, correct_threshold=args.correctness_threshold,
                              drop_unsolved=args.drop_unsolved)
        self.pef_dataset, self.split_stats = split.pef, split.stats
        # D_exp: the user's stream keeps streaming (its D_exp rows, in its order)
        self.train_dataset = stream_with_columns(train_dataset, split.exp, []) if is_stream(train_dataset) else split.exp
        self.defer_log({**summarize(presampled, args.correctness_threshold), **split.stats})
        if len(self.pef_dataset) == 0:
            if args.require_pef:
                raise ValueError(f"no prompt reached {args.pef_threshold} of {args.num_presamples} correct: D_pef is "
                                 "empty. Lower pef_threshold, or set require_pef=False to train as GRPO without KL")
            warnings.warn("DPH-RL: D_pef is empty (no near-perfect prompt); training runs as GRPO without KL",
                          stacklevel=2)
        if len(split.exp) == 0:
            dropped = split.stats["num_unsolved_dropped"]
            raise ValueError(f"D_exp is empty and there is nothing to explore: every prompt is near-perfect "
                             f"({args.pef_threshold} of {args.num_presamples} correct)"
                             + (f" or unsolved ({dropped} dropped by drop_unsolved)" if dropped else "")
                             + ". Raise pef_threshold" + (" or set drop_unsolved=False" if dropped else ""))
        per_batch = args.generation_batch_size // args.num_generations
        if len(split.exp) < per_batch:  # GRPO's sampler drops an incomplete generation batch: 0 steps, silently
            raise ValueError(f"D_exp has {len(split.exp)} prompts, fewer than one generation batch takes "
                             f"(generation_batch_size / num_generations = {args.generation_batch_size} / "
                             f"{args.num_generations} = {per_batch}): training would run 0 steps. Lower "
                             "per_device_train_batch_size (or steps_per_generation), raise pef_threshold, or train on "
                             "more prompts")
        self._pef_epoch, self._pef_pos = 0, 0  # position in the global D_pef stream (checkpointed)
        if definition:
            # GRPO computes the rollouts' reference log-probs when beta != 0; its own KL term stays off (the loss
            # below runs GRPO's with beta = 0). beta1 = eta |D_pef| / |D_exp| (App. F, eq. 16).
            self.beta = 1.0
            self.js_beta1 = args.dph_coef * len(self.pef_dataset) / len(split.exp)
        self._policy_logps = None

    # -------------------------------------------------------------------------- stage 1: the offline pass ---
    def _presample_config(self, num_samples: int, seed: int) -> PresampleConfig:
        return PresampleConfig(
            num_samples=num_samples, **sampling_options(self), record_prompt_logp=False,
            record_completion_logps=True, seed=seed, generation_batch_size=self.args.presample_generation_batch_size,
            cache_dir=self.args.presample_cache_dir,
        )

    def _fused_scorer(self, ids, mask):
        device = self.accelerator.device
        logps, _, _ = self._get_per_token_logps_and_entropies(self.model, ids.to(device), mask.to(device),
                                                              ids.size(1) - 1)
        return logps

    def _run_presample(self, dataset, num_samples: int, seed: int):
        reward_funcs = offline_reward_funcs(self, "DPHTrainer")  # reward models scored as GRPOTrainer does
        was_training = self.model.training
        self.model.eval()
        try:
            with full_parameters(self):
                return presample(self.model, self.processing_class, dataset, reward_funcs,
                                 self._presample_config(num_samples, seed), reward_weights=self.reward_weights.tolist(),
                                 accelerator=self.accelerator, token_logps_fn=self._fused_scorer,
                                 tokenize_fn=lambda prompts: trainer_prompt_ids(self, prompts),
                                 generator=trainer_generator(self), trainer_state=self.state)
        finally:
            self.model.train(was_training)

    def _presampled(self, dataset):
        if all(c in dataset.column_names for c in _PRESAMPLE_COLUMNS):
            check_presample_options(dataset, num_samples=self.args.num_presamples, **sampling_options(self))
            check_presampled_model(self, dataset)  # made by this model (its weights, in any dtype)
            check_prompt_ids(self, dataset)
            return dataset
        return self._run_presample(dataset, self.args.num_presamples, self.args.seed)

    def _correctness_index(self, presampled) -> int:
        """Column of ``ref_rewards_per_func`` whose value decides correctness (``correctness_reward``)."""
        metadata = presample_metadata(presampled) or {}
        names = metadata.get("reward_funcs") or list(self.reward_func_names)
        wanted = self.args.correctness_reward
        if wanted is None:
            if "accuracy_reward" in names:
                wanted = "accuracy_reward"
            elif len(names) == 1:
                wanted = names[0]
            else:
                raise ValueError(f"DPH-RL needs to know which reward decides that a reference sample is correct, "
                                 f"and none of the reward functions {names} is 'accuracy_reward': set "
                                 "correctness_reward to one of them (and correctness_threshold, default 1.0)")
        if wanted not in names:
            raise ValueError(f"correctness_reward={wanted!r} is not one of the reward functions {names} (the ones "
                             "the offline pass scored with): set it to one of them")
        if "ref_rewards_per_func" not in presampled.column_names:
            raise ValueError("the presampled dataset has no 'ref_rewards_per_func' column (it was made by an older "
                             "version): presample it again")
        return names.index(wanted)

    def _refinement_rewards(self, dataset, reward_index: int):
        """One extra reference sample per prompt (Sec. 4.1), scored by the reward that decides correctness; only
        D_pef prompts use it."""
        raw = dataset.remove_columns([c for c in dataset.column_names if c.startswith("ref_")])
        extra = self._run_presample(raw, 1, self.args.seed + 1)
        return [row[0][reward_index] for row in extra["ref_rewards_per_func"]]

    # ---------------------------------------------------------------------------------- the D_pef stream ---
    def _extra_state(self) -> dict:
        return {"pef_epoch": self._pef_epoch, "pef_pos": self._pef_pos}

    def _load_extra_state(self, state: dict) -> None:
        self._pef_epoch, self._pef_pos = state["pef_epoch"], state["pef_pos"]

    def _pef_order(self, epoch: int) -> list[int]:
        """The seeded permutation of D_pef for ``epoch`` (the same on every process)."""
        g = torch.Generator().manual_seed(self.args.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.pef_dataset), generator=g).tolist()

    def _next_pef_batch(self):
        """This process's ``pef_batch_size`` rows of the next global D_pef batch.

        One infinite, shuffled stream for all processes: each micro-step takes the next ``pef_batch_size x
        num_processes`` rows of it (wrapping into the next epoch's permutation mid-batch) and process ``r`` keeps
        slice ``r``. So a global step rehearses the same rows with 1 or N processes (same global batch), and every
        process holds the same stream position (``_pef_epoch``, ``_pef_pos``: checkpointed)."""
        size, world, rank = self.args.pef_batch_size, self.accelerator.num_processes, self.accelerator.process_index
        rows = []
        while len(rows) < size * world:
            order = self._pef_order(self._pef_epoch)
            take = order[self._pef_pos : self._pef_pos + size * world - len(rows)]
            rows += take
            self._pef_pos += len(take)
            if self._pef_pos >= len(order):
                self._pef_epoch, self._pef_pos = self._pef_epoch + 1, 0
        return self.pef_dataset.select(rows[rank * size : (rank + 1) * size])

    def _global_token_mean(self, values, mask):
        """This process's share of the token mean of ``values`` over the global batch: ``sum_local / (N / P)`` with
        ``N`` the unmasked tokens of all processes. Averaged over processes (as DDP averages gradients) it is the
        token mean of the whole batch, whatever the number of processes and however the tokens are spread."""
        n_tokens = self.accelerator.gather(mask.sum().detach().reshape(1)).sum().clamp(min=1.0)
        return (values * mask).sum() * self.accelerator.num_processes / n_tokens

    def _pef_tensors(self, batch):
        device = self.accelerator.device
        ids, attn, P = pack_prompt_completion(batch["prompt_ids"], batch["completion_ids"],
                                              self.processing_class.pad_token_id)
        C = ids.size(1) - P
        ref_logps = torch.zeros((ids.size(0), C))
        for i, r in enumerate(batch["completion_logps"]):
            ref_logps[i, : len(r)] = torch.tensor(r)
        return ids.to(device), attn.to(device), ref_logps.to(device), attn[:, P:].to(device), C

    # -------------------------------------------------------------------------------------------- the loss ---
    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        if self._capture_policy_logps:
            self._policy_logps = out[0]
        return out

    def _grpo_loss(self, model, inputs):
        """GRPO on D_exp rollouts with no KL term (eq. 5); in the definition form, plus beta1 * KL(pi || M)."""
        if self.args.divergence_form == "generator":
            return super()._compute_loss(model, inputs)
        self.beta, self._capture_policy_logps = 0.0, True
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self.beta, self._capture_policy_logps = 1.0, False
        mask = inputs["completion_mask"]
        _, policy_side = losses.js_definition_terms(self._policy_logps - inputs["ref_per_token_logps"])
        self._policy_logps = None
        kl = self._global_token_mean(policy_side, mask)
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["dph/js_exp_term"].append(self.accelerator.gather(kl.detach()).mean().item())
        scale = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        return loss + self.js_beta1 * kl / scale

    def _compute_loss(self, model, inputs):
        loss_exp = self._grpo_loss(model, inputs)
        mode = "train" if self.model.training else "eval"
        if mode != "train" or len(self.pef_dataset) == 0 or self.args.dph_coef == 0:
            return loss_exp
        ids, attn, ref_logps, mask, C = self._pef_tensors(self._next_pef_batch())
        logps, _, _ = self._get_per_token_logps_and_entropies(model, ids, attn, C)
        log_u = logps - ref_logps
        if self.args.divergence_form == "definition":
            f, _ = losses.js_definition_terms(log_u)  # KL(pi_ref || M) on reference samples (eq. 17)
        else:
            f = losses.f_divergence(log_u, self.args.divergence, self.args.divergence_alpha)
        loss_pef = self._global_token_mean(f, mask)  # token mean over the global D_pef batch (eq. 6)
        eta, ga = self.args.dph_coef, self.current_gradient_accumulation_steps
        if self.args.loss_combination == "sum":  # eq. 7
            loss = loss_exp + eta * loss_pef / ga
        else:
            n_exp, n_pef = inputs["completion_ids"].size(0), ids.size(0)
            loss = (n_exp * loss_exp + eta * n_pef * loss_pef / ga) / (n_exp + n_pef)
        metrics = self._metrics[mode]
        gather = self.accelerator.gather
        metrics["dph/loss_exp"].append(gather(loss_exp.detach() * ga).mean().item())
        metrics["dph/loss_pef"].append(gather(loss_pef.detach()).mean().item())
        n_tok = gather(mask.sum()).sum().clamp(min=1)
        metrics["dph/log_u_mean"].append((gather((log_u.detach() * mask).sum()).sum() / n_tok).item())
        metrics["dph/num_pef_rows"].append(float(len(self.pef_dataset)))
        metrics["dph/num_exp_prompts"].append(float(self.split_stats["num_exp_prompts"]))
        return loss
