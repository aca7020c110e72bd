"""DPH-RL's addition to GRPO, as a part: rehearsal of near-perfect prompts with an f-divergence (DPH-RL paper,
arXiv 2509.07430, Sec. 4, eq. 5-7, App. C, F, G; equations and defaults in docs/algorithms.md).

1. Before training (once, cached; ``setup``): k reference samples per training prompt and their rewards; prompts
   with at least ``pef_threshold`` correct form D_pef (their correct completions are kept with per-token reference
   log-probs), the rest D_exp, which becomes the GRPO training set. A dataset made by ``trl-variants presample`` is
   used as is.
2. Each step (``loss``): GRPO/PPO-clip on D_exp rollouts with no KL term (eq. 5), plus ``eta`` times the token mean of
   the generator ``f(u)``, ``u = pi_theta / pi_ref`` on a batch of stored D_pef completions (eq. 6; the loss term
   ``dph_pef``, on the batch ``dph_pef``), one loss, one backward (eq. 7; the trainer adds the terms,
   ``loss_combination``). No reference model: pi_ref is only the stored log-probs.
Option ``divergence_form="definition"`` (App. F): JS through its definition, with a live reference model: GRPO
computes the rollouts' reference log-probs (``beta`` is 1 for that) but its own KL term is left out of the loss
(``beta`` is 0 while GRPO's loss runs); ``beta1 * KL(pi || M)`` on D_exp is added here.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import torch

from .. import losses
from .._citations import DPH
from .._data import is_stream, read_stream, stream_with_columns
from .._model import frozen_copy_of_policy, is_peft_model
from .._offline import refuse_offline_sampling, sampling_options, stored_or_computed, trainer_presample
from .._validation import reward_func_names
from ..generation import pack_prompt_completion
from ..parts import LossTerm, Part, register_part
from ..presample import PresampleConfig
from ..presample.metadata import presample_metadata, summarize
from ..presample.stored import check_presampled_columns, check_stored_columns
from .split import dph_split

PRESAMPLE_COLUMNS = ("ref_rewards", "ref_completion_ids", "ref_completion_logps", "ref_prompt_ids")


def correctness_index(names: list[str], wanted: str | None) -> int:
    """Which of the reward functions ``names`` decides that a reference sample is correct: ``correctness_reward``
    (``wanted``), else ``accuracy_reward``, else the only one."""
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
    return names.index(wanted)


@register_part
class Rehearsal(Part):
    """The D_pef rehearsal term (and, in the definition form, App. F's D_exp term). The trainer holds the split:
    ``pef_dataset``, ``split_stats``, the D_exp ``train_dataset``; the part holds the D_pef stream position
    ``pef_epoch`` / ``pef_pos`` (checkpointed through :meth:`state`). Loss terms ``dph_pef`` (eta L_pef) and, in the
    definition form, ``dph_js_exp`` (beta1 KL on D_exp). Metrics: ``dph/loss_exp``, ``dph/loss_pef``,
    ``dph/log_u_mean``, ``dph/num_pef_rows``, ``dph/num_exp_prompts`` (``dph/js_exp_term`` in the definition form)."""

    name = "dph_rehearsal"
    citation, tag = DPH, "dph-rl"  # model cards
    offline_pass = True

    def __init__(self, args):
        self.args = args
        self.definition = args.divergence_form == "definition"

    @classmethod
    def from_config(cls, args) -> Rehearsal:
        return cls(args)

    @property
    def forwards_own_batch(self) -> bool:  # the D_pef forward (none at eta = 0)
        return self.args.dph_coef != 0

    def check(self, trainer_name, args, train_dataset, kwargs) -> None:
        if train_dataset is None:
            raise ValueError(f"{trainer_name} needs a train_dataset (prompts, or the output of trl-variants presample)")
        # the split samples one turn per prompt: no tool calls, no environments (refused again by sampling_options)
        refuse_offline_sampling(trainer_name, tools=kwargs.get("tools"),
                                environments=kwargs.get("environment_factory") is not None)
        options = f"--num_samples {args.num_presamples} --record_completion_logps true"  # what makes the columns
        check_presampled_columns(train_dataset, PRESAMPLE_COLUMNS, trainer_name, options)
        check_stored_columns(train_dataset, trainer_name, options, ["ref_completion_logps"])  # impossible values
        # which reward decides correctness: known before anything loads (it failed after the whole offline pass)
        if not is_stream(train_dataset):  # a stream's stored names are read in setup(), with the stream
            stored = presample_metadata(train_dataset) or {}
            correctness_index(stored.get("reward_funcs") or reward_func_names(kwargs.get("reward_funcs")),
                              args.correctness_reward)

    # ---------------------------------------------------------------------- stage 1: the offline pass, split ---
    def setup(self, trainer) -> None:
        args = self.args
        if self.definition:  # App. F needs a live reference: the frozen start (the disabled adapter under PEFT)
            if not is_peft_model(trainer.accelerator.unwrap_model(trainer.model)):
                trainer.ref_model = frozen_copy_of_policy(trainer)
        given = trainer.train_dataset
        # a stream is read once, in full: the split needs every prompt
        rows = read_stream(given, "DPH-RL's offline pass") if is_stream(given) else given
        presampled = self._presampled(trainer, rows)
        reward_index = self._correctness_index(trainer, presampled)
        split = dph_split(presampled, args.pef_threshold, args.pef_keep,
                          self._refinement_rewards(trainer, rows, reward_index) if args.pef_refine else None,
                          reward_index=reward_index, correct_threshold=args.correctness_threshold,
                          drop_unsolved=args.drop_unsolved)
        trainer.pef_dataset, trainer.split_stats = split.pef, split.stats
        # D_exp: the user's stream keeps streaming (its D_exp rows, in its order)
        trainer.train_dataset = stream_with_columns(given, split.exp, []) if is_stream(given) else split.exp
        trainer.defer_log({**summarize(presampled, args.correctness_threshold), **split.stats})
        if len(trainer.pef_dataset) == 0:
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
        self.pef_epoch, self.pef_pos = 0, 0  # position in the global D_pef stream (checkpointed)
        if self.definition:
            # GRPO computes the rollouts' reference log-probs when beta != 0; its own KL term stays off (the loss
            # below runs GRPO's with beta = 0). beta1 = eta |D_pef| / |D_exp| (App. F, eq. 16).
            trainer.beta = 1.0
            trainer.js_beta1 = args.dph_coef * len(trainer.pef_dataset) / len(split.exp)

    def _presample_config(self, trainer, num_samples: int, seed: int) -> PresampleConfig:
        return PresampleConfig(
            num_samples=num_samples, **sampling_options(trainer), record_prompt_logp=False,
            record_completion_logps=True, seed=seed, generation_batch_size=self.args.presample_generation_batch_size,
            cache_dir=self.args.presample_cache_dir,
        )

    def _run_presample(self, trainer, dataset, num_samples: int, seed: int):
        return trainer_presample(trainer, dataset, self._presample_config(trainer, num_samples, seed))

    def _presampled(self, trainer, dataset):
        """``dataset`` with the k reference samples, their rewards and log-probs: stored, or sampled now."""
        return stored_or_computed(
            trainer, dataset, PRESAMPLE_COLUMNS,
            lambda rows: self._run_presample(trainer, rows, self.args.num_presamples, self.args.seed),
            num_samples=self.args.num_presamples, **sampling_options(trainer))

    def _correctness_index(self, trainer, presampled) -> int:
        """Column of ``ref_rewards_per_func`` whose value decides correctness (``correctness_reward``)."""
        metadata = presample_metadata(presampled) or {}
        index = correctness_index(metadata.get("reward_funcs") or list(trainer.reward_func_names),
                                  self.args.correctness_reward)
        if "ref_rewards_per_func" not in presampled.column_names:
            raise ValueError("the presampled dataset has no 'ref_rewards_per_func' column (it was made by an older "
                             "version): presample it again")
        return index

    def _refinement_rewards(self, trainer, dataset, reward_index: int):
        """One extra reference sample per prompt (Sec. 4.1), scored by the reward that decides correctness; only
        D_pef prompts use it."""
        raw = dataset.remove_columns([c for c in dataset.column_names if c.startswith("ref_")])
        extra = self._run_presample(trainer, raw, 1, self.args.seed + 1)
        return [row[0][reward_index] for row in extra["ref_rewards_per_func"]]

    # ---------------------------------------------------------------------------------- the D_pef stream ---
    def state(self) -> dict:
        return {"pef_epoch": self.pef_epoch, "pef_pos": self.pef_pos}

    def load_state(self, state: dict) -> None:
        self.pef_epoch, self.pef_pos = state["pef_epoch"], state["pef_pos"]

    def _pef_order(self, trainer, epoch: int) -> list[int]:
        """The seeded permutation of D_pef for ``epoch`` (the same on every process)."""
        g = torch.Generator().manual_seed(self.args.seed * 1_000_003 + epoch)
        return torch.randperm(len(trainer.pef_dataset), generator=g).tolist()

    def next_pef_batch(self, trainer):
        """This process's ``pef_batch_size`` rows of the next global D_pef batch.

        One infinite, shuffled stream for all processes: each micro-step takes the next ``pef_batch_size x
        num_processes`` rows of it (wrapping into the next epoch's permutation mid-batch) and process ``r`` keeps
        slice ``r``. So a global step rehearses the same rows with 1 or N processes (same global batch), and every
        process holds the same stream position (``pef_epoch``, ``pef_pos``: checkpointed)."""
        size, world, rank = self.args.pef_batch_size, trainer.accelerator.num_processes, trainer.accelerator.process_index
        rows = []
        while len(rows) < size * world:
            order = self._pef_order(trainer, self.pef_epoch)
            take = order[self.pef_pos : self.pef_pos + size * world - len(rows)]
            rows += take
            self.pef_pos += len(take)
            if self.pef_pos >= len(order):
                self.pef_epoch, self.pef_pos = self.pef_epoch + 1, 0
        return trainer.pef_dataset.select(rows[rank * size : (rank + 1) * size])

    @staticmethod
    def _pef_tensors(trainer, batch):
        device = trainer.accelerator.device
        ids, attn, P = pack_prompt_completion(batch["prompt_ids"], batch["completion_ids"],
                                              trainer.processing_class.pad_token_id)
        C = ids.size(1) - P
        ref_logps = torch.zeros((ids.size(0), C))
        for i, r in enumerate(batch["completion_logps"]):
            ref_logps[i, : len(r)] = torch.tensor(r)
        return ids.to(device), attn.to(device), ref_logps.to(device), attn[:, P:].to(device), C

    # -------------------------------------------------------------------------------------------- the loss ---
    @contextmanager
    def around_grpo_loss(self, trainer):
        """GRPO's own loss with no KL term (eq. 5): in the definition form ``beta`` is 1 only so that GRPO computes
        the rollouts' reference log-probs."""
        if not self.definition:
            yield
            return
        trainer.beta = 0.0
        try:
            yield
        finally:
            trainer.beta = 1.0

    def loss(self, trainer, model, inputs, forward):
        args, mode = self.args, "train" if trainer.model.training else "eval"
        metrics, gather = trainer._metrics[mode], trainer.accelerator.gather
        terms = {}
        if self.definition:  # + beta1 * KL(pi || M) on D_exp rollouts (App. F)
            _, policy_side = losses.js_definition_terms(forward.completion_logps - inputs["ref_per_token_logps"])
            policy_side = losses.on_policy_sample_loss(policy_side, forward.completion_logps)  # rollouts are pi's
            kl = trainer.global_token_mean(policy_side, inputs["completion_mask"])
            metrics["dph/js_exp_term"].append(gather(kl.detach()).mean().item())
            terms["dph_js_exp"] = trainer.js_beta1 * kl
        if mode != "train" or len(trainer.pef_dataset) == 0 or args.dph_coef == 0:
            return terms
        ids, attn, ref_logps, mask, C = self._pef_tensors(trainer, self.next_pef_batch(trainer))
        logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, attn, C)
        log_u = logps - ref_logps
        if self.definition:
            f, _ = losses.js_definition_terms(log_u)  # KL(pi_ref || M) on reference samples (eq. 17)
        else:
            f = losses.f_divergence(log_u, args.divergence, args.divergence_alpha)
        loss_pef = trainer.global_token_mean(f, mask)  # token mean over the global D_pef batch (eq. 6)
        # eta * L_pef on the D_pef batch; the trainer combines it with L_exp (loss_combination: eq. 7's sum, or
        # weighted by the rows of each batch)
        terms["dph_pef"] = LossTerm(args.dph_coef * loss_pef, batch="dph_pef", rows=ids.size(0))
        metrics["dph/loss_pef"].append(gather(loss_pef.detach()).mean().item())
        n_tok = gather(mask.sum()).sum().clamp(min=1)
        metrics["dph/log_u_mean"].append((gather((log_u.detach() * mask).sum()).sum() / n_tok).item())
        metrics["dph/num_pef_rows"].append(float(len(trainer.pef_dataset)))
        metrics["dph/num_exp_prompts"].append(float(trainer.split_stats["num_exp_prompts"]))
        return terms

    def after_loss(self, trainer, batch_losses) -> None:
        """``dph/loss_exp``: L_exp, the loss on the D_exp rollouts (GRPO's plus every part's term on them), logged
        beside ``dph/loss_pef`` when a D_pef batch was rehearsed."""
        if "dph_pef" in batch_losses:
            trainer._metrics["train"]["dph/loss_exp"].append(
                trainer.accelerator.gather(batch_losses["rollout"].reshape(1)).mean().item())
