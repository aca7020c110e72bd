"""A*-PO: offline optimal values, then least-squares regression of optimal advantages with one sample per prompt
(A*-PO paper, arXiv 2505.20686, Sec. 3 and Algorithm 1; equations and defaults in docs/algorithms.md).

1. Stage 1 (once, cached, before training): N reference samples per prompt, their rewards and
   ``V_hat(x) = beta1 log mean exp(r / beta1)`` (``trl_variants.presample``). A dataset made by ``trl-variants
   presample`` (with ``ref_value``) is used as is. Lazily (``lazy_value_pass``; by default when it is safe and
   saves work) the same shards are computed during training, only those the run reaches, in the sampler's order,
   ahead of need (:class:`LazyValues`).
2. Stage 2, each step: one completion per prompt from the current policy (GRPO's generation and reward functions),
   target ``r - V_hat(x)``, loss ``mean (beta2 * sum_t [log pi - log pi_ref] - (r - V_hat))^2``.
The reference is the frozen starting policy: loaded from the model's path, the disabled adapter with PEFT, or a copy
of the weights you passed when the model is an in-memory object.
"""

from __future__ import annotations

import math
import time
import warnings

import torch
from transformers import PreTrainedModel

from .. import losses
from .._citations import APO, paper
from .._data import is_stream, run_on_rows
from .._model import frozen_copy_of_policy, is_peft_model, params_sharded
from .._offline import (
    refuse_offline_sampling,
    sampling_options,
    stored_or_computed,
    trainer_presample,
    trainer_prompt_ids,
)
from .._trainer import TrainerBase
from ..presample import PresampleConfig, summarize
from ..presample.metadata import is_correct
from ..presample.runner import shard_rows
from ..presample.stored import check_presampled_columns, check_stored_columns
from .config import APOConfig

LAZY_ROW = "apo_lazy_row"
"""Column the lazy stage 1 adds to the training rows: the row's index in the dataset, to find its value."""


class LazyValues:
    """State of the lazy stage 1: the dataset the pass runs on (the user's rows: the cache key is of them), the rows
    in the order the train sampler will ask for them, the values known so far (whole shards) and what was done."""

    def __init__(self, dataset, order: list[int], shard_size: int, chunk_size: int):
        self.dataset, self.order, self.shard_size, self.chunk_size = dataset, order, shard_size, chunk_size
        self.position = {r: i for i, r in enumerate(order)}
        self.prompt_ids = None  # every row's prompt ids, as the trainer tokenizes them (the pass keys on them)
        self.values: dict[int, float] = {}
        self.rewards: dict[int, list[float]] = {}
        self.done: list[int] = []  # shards, in the order they were computed
        self.steps: list[int] = []  # global step at which each chunk ran
        self.seconds = 0.0
        self.unvalued: set[int] = set()  # rows met without a value estimate (warned about once each)

    def plan(self, needed) -> list[int]:
        """The shards to compute so that every row in ``needed`` has a value: theirs, then those of the next
        ``chunk_size`` rows in sampler order from the first missing one (ahead of need), in order of first need."""
        missing = sorted({r for r in needed if r not in self.values}, key=lambda r: (self.position.get(r, math.inf), r))
        if not missing:
            return []
        start = min(self.position.get(r, len(self.order)) for r in missing)
        ahead = [r for r in self.order[start:] if r not in self.values][: self.chunk_size]
        shards = []
        for r in missing + ahead:
            s = r // self.shard_size
            if s not in shards:
                shards.append(s)
        return shards

    def add(self, shards, chunk, step: int, seconds: float) -> None:
        rows = [r for s in sorted(shards) for r in shard_rows(s, self.shard_size, len(self.dataset))]
        for r, v, rs in zip(rows, chunk["ref_value"], chunk["ref_rewards"], strict=True):
            self.values[r], self.rewards[r] = v, rs
        self.done += list(shards)
        self.steps.append(step)
        self.seconds += seconds

    def metrics(self, threshold: float) -> dict:
        from datasets import Dataset

        rows = sorted(self.values)
        valued = Dataset.from_dict({"ref_rewards": [self.rewards[r] for r in rows],
                                    "ref_value": [self.values[r] for r in rows]})
        return {**summarize(valued, threshold), "seconds": self.seconds, "lazy_chunks": len(self.steps),
                "lazy_shards": len(self.done), "lazy_prompts": len(rows),
                "lazy_fraction": len(rows) / len(self.dataset)}


class APOTrainer(TrainerBase):
    """A*-PO. Takes GRPOTrainer's arguments; see [`APOConfig`]."""

    _tag_names = ["trl", "a-star-po"]
    _name = "A*-PO"
    _paper = paper("Accelerating RL for LLM Reasoning with Optimal Advantage Regression", "2505.20686", APO)
    _config_class = APOConfig
    _config_suffix = "APO"

    def __init__(self, model, reward_funcs=None, args: APOConfig | None = None, train_dataset=None,
                 eval_dataset=None, peft_config=None, **kwargs):
        args = self._checked_args(model, args, train_dataset)
        if train_dataset is None:
            raise ValueError("APOTrainer needs a train_dataset (prompts, or the output of trl-variants presample)")
        # stage 1 samples one turn per prompt: no tool calls, no environments (refused again by sampling_options)
        refuse_offline_sampling("APOTrainer", tools=kwargs.get("tools"),
                                environments=kwargs.get("environment_factory") is not None)
        options = f"--num_samples {args.num_value_samples} --value_beta {args.value_beta}"  # what makes ref_value
        check_presampled_columns(train_dataset, ["ref_value"], "APOTrainer", options)
        # GRPOTrainer reloads its reference from the model's name; for an in-memory model that is not the policy we
        # were given, so in that case we build the reference ourselves from the given weights.
        own_reference = isinstance(model, PreTrainedModel) and peft_config is None
        check_stored_columns(train_dataset, "APOTrainer", options, ["ref_value"])  # values that cannot be true
        reward_funcs = self._checked_reward_funcs(model, reward_funcs, train_dataset, args)
        beta2 = args.beta
        if own_reference:
            args.beta = 0.0
        try:
            super().__init__(model, reward_funcs, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                             peft_config=peft_config, **kwargs)
        finally:
            args.beta = beta2
        if own_reference:
            self.beta = beta2
            self.ref_model = frozen_copy_of_policy(self)
        self._lazy = None
        self._policy_updated = False  # set by the first training step (and kept when train() is called again)
        self._warned_non_binary = self._warned_non_binary_values = False  # check_binary_rewards: rollouts, stage 1
        with self.offline_pass():  # a stream is read once, in full, then streams with its values looked up
            if self._runs_lazily(train_dataset):
                self.train_dataset = self._lazy_setup(train_dataset)
            else:
                self.train_dataset = run_on_rows(train_dataset, self._with_values, ["ref_value"],
                                                 "A*-PO's stage 1")[0]
            self.prepare_eval_datasets()

    # ---------------------------------------------------------------------------------- stage 1 (offline) ---
    def _value_pass(self, dataset, shards=None):
        """``dataset`` with stage 1's columns (``ref_value`` among them): checked when present, else sampled from the
        reference policy (:meth:`_sample_values`)."""
        args = self.args
        return stored_or_computed(self, dataset, ["ref_value"], lambda rows: self._sample_values(rows, shards),
                                  num_samples=args.num_value_samples, value_beta=args.value_beta,
                                  **sampling_options(self))

    def _sample_values(self, dataset, shards=None):
        """Stage 1 run now: N samples per prompt from the reference policy (the model as given before the first
        update; afterwards the frozen reference), their rewards and ``V_hat(x)``."""
        args = self.args
        config = PresampleConfig(
            num_samples=args.num_value_samples, value_beta=args.value_beta, **sampling_options(self),
            record_prompt_logp=False, seed=args.seed, cache_dir=args.presample_cache_dir,
            generation_batch_size=args.presample_generation_batch_size, shard_size=args.presample_shard_size,
            show_progress=shards is None,  # the lazy pass runs during training: no bar or summary of its own
        )
        lazy, tokenize_fn = self._lazy, None
        if shards is not None and lazy is not None:  # the lazy pass: all the prompts' ids, tokenized once
            if lazy.prompt_ids is None:
                lazy.prompt_ids = trainer_prompt_ids(self, list(dataset["prompt"]))

            def tokenize_fn(prompts):
                return lazy.prompt_ids
        trained = self.state.global_step > 0 or self._policy_updated  # a second train() starts again at step 0
        if trained and (params_sharded(self) or self.ref_model is None
                        and not is_peft_model(self.accelerator.unwrap_model(self.model))):
            raise ValueError("APOTrainer.evaluate: this eval_dataset has no 'ref_value' column and, after training "
                             "started, there is no unsharded reference model to sample it from. Pass the dataset as "
                             "APOTrainer(eval_dataset=...), or presample it (trl-variants presample)")
        # after the first update the policy is not the reference any more: sample the frozen reference (with HF
        # generate: a vLLM engine holds the policy's weights)
        model = self.ref_model if trained and self.ref_model is not None else self.model
        # The cache key holds the model's config. GRPOTrainer turns the policy's config.use_cache off; generate reads
        # use_cache from the generation config, not from there. With the policy's value the reference (same weights)
        # has the key of the pass made before training, so the shards sampled after the first update (lazy stage 1,
        # evaluation) are shared with it.
        ref_config = self.accelerator.unwrap_model(model).config if model is not self.model else None
        use_cache = getattr(ref_config, "use_cache", None)
        if ref_config is not None and hasattr(ref_config, "use_cache"):
            ref_config.use_cache = getattr(self.accelerator.unwrap_model(self.model).config, "use_cache", use_cache)
        try:
            with self._reference_weights():
                return trainer_presample(self, dataset, config, model=model, tokenize_fn=tokenize_fn,
                                         generator=not (trained and self.use_vllm), shards=shards)
        finally:
            if ref_config is not None and hasattr(ref_config, "use_cache"):
                ref_config.use_cache = use_cache

    def _with_valued_prompts(self, dataset, split: str):
        """The prompts of ``dataset`` that have a value estimate (warning about the others)."""
        no_value = [i for i, v in enumerate(dataset["ref_value"]) if not math.isfinite(v)]
        if no_value:  # every reference sample of these prompts lacked a reward (TRL: None / NaN is excluded)
            warnings.warn(f"A*-PO: {len(no_value)} prompts have no value estimate (none of their "
                          f"{self.args.num_value_samples} reference samples got a reward, e.g. row {no_value[0]}); "
                          f"they are left out of {split}", stacklevel=3)
            dataset = dataset.select(sorted(set(range(len(dataset))) - set(no_value)))
            if len(dataset) == 0:
                raise ValueError("no prompt has a value estimate: every reference sample got no reward (the reward "
                                 "functions returned None or NaN). Check the reward functions on this dataset")
        return dataset

    def _with_eval_columns(self, dataset):
        return run_on_rows(dataset, lambda rows: self._with_valued_prompts(self._value_pass(rows), "evaluation"),
                           ["ref_value"], "A*-PO's stage 1")[0]

    def _warn_non_binary_values(self, rewards_per_prompt) -> None:
        """``check_binary_rewards`` for stage 1: V_hat made of rewards outside {0, 1} (once a run; the rollouts'
        are checked on their own in :meth:`_generate_and_score_completions`)."""
        if not self.args.check_binary_rewards or self._warned_non_binary_values:
            return
        odd = sorted({r for rs in rewards_per_prompt for r in rs if math.isfinite(r) and r not in (0.0, 1.0)})
        if odd:
            warnings.warn("A*-PO assumes binary rewards in {0, 1} (V_hat's limits and the paper's analysis); stage 1's "
                          f"reference samples got {odd[:5]}, and V_hat(x) was computed from them", stacklevel=3)
            self._warned_non_binary_values = True

    def _with_values(self, dataset):
        args = self.args
        dataset = self._value_pass(dataset)
        if "ref_rewards" in dataset.column_names:  # a dataset may hold ref_value alone
            self._warn_non_binary_values(dataset["ref_rewards"])
        self.defer_log(summarize(dataset, args.correctness_threshold))  # before any prompt is left out
        dataset = self._with_valued_prompts(dataset, "training")
        if args.filter_all_incorrect:
            t = args.correctness_threshold
            kept = dataset.filter(lambda rs: any(is_correct(r, t) for r in rs), input_columns="ref_rewards")
            if len(kept) == 0:
                raise ValueError(f"filter_all_incorrect dropped all {len(dataset)} prompts (every reference sample "
                                 "was wrong): nothing to train on. Set filter_all_incorrect=False or use easier data")
            dataset = kept
        self.defer_log({"num_prompts_kept": len(dataset)})
        return dataset

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._policy_updated = True  # the optimizer step that follows moves the policy away from the reference
        return loss

    # ------------------------------------------------------------------------------------ lazy stage 1 ---
    def _runs_lazily(self, dataset) -> bool:
        """Whether stage 1 runs lazily. ``lazy_value_pass=True``: yes (refused where it is not safe: by the config
        and :meth:`_lazy_setup`); ``False``: no; ``None`` (default): when it is safe (none of the refusals applies,
        there is a frozen reference model to sample after the first update; not with PEFT, whose cache key holds
        the adapter, so chunks sampled after the first update would not be shared) and saves at least half the
        work: the run reaches at most half the stage-1 shards, divided by the number of processes (a lazy chunk
        covers a few shards, so on N processes most wait while it runs). A dataset with ``ref_value`` is used as
        is."""
        args = self.args
        if args.lazy_value_pass is False or "ref_value" in (dataset.column_names or []):
            return False
        if args.lazy_value_pass:
            return True
        if (args.filter_all_incorrect or args.use_vllm or is_stream(dataset) or params_sharded(self)
                or LAZY_ROW in dataset.column_names):
            return False
        if self.ref_model is None or is_peft_model(self.accelerator.unwrap_model(self.model)):
            return False
        shard = args.presample_shard_size
        reached = len({r // shard for r in self._sampler_order(dataset)})
        return 2 * self.accelerator.num_processes * reached <= math.ceil(len(dataset) / shard)

    def _lazy_setup(self, dataset):
        """``lazy_value_pass``: nothing sampled now; the training rows gain their index (:data:`LAZY_ROW`) and the
        order in which the sampler will ask for them is worked out (the sampler is seeded)."""
        if is_stream(dataset):
            raise ValueError("lazy_value_pass needs a map-style train_dataset (a streaming dataset has no sampler "
                             "order to follow). Set lazy_value_pass=False")
        if params_sharded(self):
            raise ValueError("lazy_value_pass with ZeRO-3 / FSDP: the lazy pass samples the reference during "
                             "training, which needs unsharded weights. Set lazy_value_pass=False")
        if LAZY_ROW in dataset.column_names:
            raise ValueError(f"the train_dataset has a column {LAZY_ROW!r}, which lazy_value_pass adds: rename it")
        rows = dataset.add_column(LAZY_ROW, list(range(len(dataset))))
        args = self.args
        self._lazy = LazyValues(dataset, self._sampler_order(rows), args.presample_shard_size,
                                args.lazy_value_chunk_size)
        self.defer_log({"lazy_prompts": 0, "lazy_fraction": 0.0})
        return rows

    def _sampler_order(self, dataset) -> list[int]:
        """The dataset rows the run will reach, in the order the train sampler yields them: GRPOTrainer's seeded
        ``RepeatSampler`` (epochs are further passes of the same sampler object, as the Trainer iterates it),
        over the indices ``max_steps`` (else ``num_train_epochs``) optimizer steps consume, all processes together.
        Only the look-ahead depends on it: a row asked for out of this order is valued when asked for."""
        args, world = self.args, self.accelerator.num_processes
        sampler = self._get_train_sampler(dataset)
        per_epoch = len(sampler)
        if args.max_steps > 0:  # each micro-step takes a batch of per_device * steps_per_generation per process
            needed = args.max_steps * args.gradient_accumulation_steps * world * self._train_batch_size \
                * args.steps_per_generation
        else:
            needed = math.ceil(args.num_train_epochs * per_epoch)
        stream, seen = [], set()
        while len(stream) < needed and len(seen) < len(dataset) and per_epoch:
            epoch = list(sampler)
            stream += epoch
            seen.update(epoch)
        return list(dict.fromkeys(stream[:needed]))

    def _lazy_values(self, inputs):
        """``inputs`` (this process's rows of a generation batch) with their ``ref_value``; computes, on every
        process together, the shards the generation batch of ALL processes needs and the look-ahead."""
        from accelerate.utils import gather_object

        lazy = self._lazy
        rows = [x[LAZY_ROW] for x in inputs]
        every = gather_object(rows) if self.accelerator.num_processes > 1 else rows
        shards = lazy.plan(every)
        if shards:
            start = time.perf_counter()
            report_to, self.args.report_to = self.args.report_to, []  # see OfflinePassLogMixin
            try:  # the pass leaves the random state as it found it (training's draws do not depend on when it ran)
                chunk = self._value_pass(lazy.dataset, shards=shards)
            finally:
                self.args.report_to = report_to
            lazy.add(shards, chunk, self.state.global_step, time.perf_counter() - start)
            self._warn_non_binary_values(chunk["ref_rewards"])
            self.defer_log(lazy.metrics(self.args.correctness_threshold))
            if not any(math.isfinite(v) for v in lazy.values.values()):  # as the full pass: broken rewards
                raise ValueError(f"no prompt has a value estimate: every reference sample of the {len(lazy.values)} "
                                 "prompts valued so far got no reward (the reward functions returned None or NaN). "
                                 "Check the reward functions on this dataset")
        no_value = sorted({r for r in every if not math.isfinite(lazy.values[r])})
        new = [r for r in no_value if r not in lazy.unvalued]
        if new:  # the same on every process
            lazy.unvalued.update(new)
            warnings.warn(f"A*-PO's lazy stage 1: {len(new)} more prompts have no value estimate (none of their "
                          f"{self.args.num_value_samples} reference samples got a reward, e.g. row {new[0]}); their "
                          f"rows are left out of the loss (the full pass leaves them out of the dataset). "
                          f"{len(lazy.unvalued)} so far", stacklevel=2)
        # all processes agree: the loss leaves them out (and logs it) together, normalised by the valued rows of the
        # whole generation batch, so 1 and N processes give the same loss
        self._unvalued_in_batch = bool(no_value)
        self._valued_rows = sum(math.isfinite(lazy.values[r]) for r in every)
        return [{**x, "ref_value": lazy.values[x[LAZY_ROW]]} for x in inputs]

    def _reference_weights(self):
        """Context in which ``self.model`` computes the reference policy (PEFT: adapter disabled)."""
        from contextlib import nullcontext

        from trl.trainer.utils import use_adapter

        model = self.accelerator.unwrap_model(self.model)
        if is_peft_model(model):
            return use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None)
        return nullcontext()

    # --------------------------------------------------------------------------------- stage 2 (online) ---
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self._rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self._rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._unvalued_in_batch = False
        if self._lazy is not None and inputs and LAZY_ROW in inputs[0]:
            inputs = self._lazy_values(inputs)
        output = super()._generate_and_score_completions(inputs)
        device = self.accelerator.device
        rewards = (self._rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)
        rank, n = self.accelerator.process_index, len(inputs)
        rewards = rewards[rank * n : (rank + 1) * n]
        if self.args.check_binary_rewards and not self._warned_non_binary and not torch.isin(
                rewards, torch.tensor([0.0, 1.0], device=device)).all():
            warnings.warn("A*-PO assumes binary rewards in {0, 1} (V_hat's limits and the paper's analysis); got "
                          f"{sorted(set(rewards.tolist()))[:5]}", stacklevel=2)
            self._warned_non_binary = True
        values = torch.tensor([x["ref_value"] for x in inputs], dtype=rewards.dtype, device=device)
        if self._unvalued_in_batch:  # lazy stage 1: rows without a value estimate are left out of the loss
            valued = torch.isfinite(values)
            per_micro_batch = self._valued_rows / (self.args.steps_per_generation * self.accelerator.num_processes)
            output["apo_weights"] = valued.to(rewards.dtype) / max(per_micro_batch, 1e-12)
            values = torch.where(valued, values, rewards)  # a finite target (advantage 0); its weight is 0
        output["apo_rewards"], output["apo_values"] = rewards, values
        output["advantages"] = rewards - values  # the regression target r - V_hat(x)
        return output

    def _compute_loss(self, model, inputs):
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        mask = inputs["completion_mask"]
        bonus = bool(self.args.entropy_coef)  # entropies cost a full-vocabulary pass: only when they are used
        logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, ids, attn, inputs["completion_ids"].size(1), compute_entropy=bonus,
            compute_aux_loss=self.aux_loss_enabled)
        seq_log_ratio = ((logps - inputs["ref_per_token_logps"]) * mask).sum(-1)
        weights = inputs.get("apo_weights")  # rows without a value estimate (lazy stage 1) have weight 0
        loss = losses.apo_loss(seq_log_ratio, inputs["apo_rewards"], inputs["apo_values"], self.beta, weights=weights)
        mode = "train" if self.model.training else "eval"
        metrics, gather = self._metrics[mode], self.accelerator.gather
        metrics["apo/regression_loss"].append(gather(loss.detach()).mean().item())
        kept = None if weights is None else (weights > 0).to(seq_log_ratio.dtype)  # rows in the loss

        def mean_of_kept(x):  # every row, unless the lazy stage 1 left some out of the loss
            if kept is None:
                return gather(x).mean().item()
            return (gather(x * kept).sum() / gather(kept).sum().clamp(min=1.0)).item()

        if kept is not None:  # present on every process or on none (_lazy_values)
            metrics["apo/unvalued_fraction"].append(1.0 - gather(kept).mean().item())
        if bonus:
            tokens = mask if kept is None else mask * kept.unsqueeze(1)
            entropy = (entropies * tokens).sum() / tokens.sum().clamp(min=1.0)
            loss = loss - self.args.entropy_coef * entropy
            metrics["entropy"].append(gather(entropy.detach()).mean().item())
        if self.aux_loss_enabled:  # a mixture-of-experts model's router balance loss, added as GRPOTrainer adds it
            loss = loss + self.router_aux_loss_coef * aux_loss
            metrics["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        metrics["apo/value_mean"].append(mean_of_kept(inputs["apo_values"]))
        metrics["apo/advantage_mean"].append(mean_of_kept(inputs["advantages"]))
        metrics["apo/seq_log_ratio_mean"].append(mean_of_kept(seq_log_ratio.detach()))
        return loss / (self.current_gradient_accumulation_steps if mode == "train" else 1.0)
