"""ERPO's two additions to GRPO, as parts (ERPO preprint Sec. 4, App. G; equations in docs/algorithms.md).

Per step, on top of GRPO:

1. :class:`QueryWeights`: after the rollouts are scored, each completion's advantage is multiplied by the query weight
   ``w_B(s)`` of its prompt (eq. 8), from prompt log-likelihoods under stop-gradient: the rollout policy's (one
   forward per distinct prompt, ``query_weight_source="policy"``) or the stored reference values (``"reference"``).
2. :class:`QueryKL`: the loss gains ``alpha * mean_s k3(l_ref(s) - l_theta(s))`` (eq. 10-11), ``l_theta(s)`` read
   off GRPO's own policy forward (the parts trainer scores the prompt positions in that same forward), ``l_ref(s)``
   from a dataset column computed once before training (:func:`provide_reference_prompt_logps`). No reference model.
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from .. import losses
from .._citations import ERPO
from .._data import run_on_rows
from .._model import full_parameters, on_accelerator_device
from .._offline import stored_or_computed, trainer_prompt_ids
from .._validation import check_finite_column
from ..parts import Part, register_part
from ..presample.stored import check_stored_columns
from .reference import add_reference_prompt_logps


# ------------------------------------------------------------------------- l_ref(s), once per dataset ---
def provide_reference_prompt_logps(trainer, dataset, split: str):
    """``dataset`` with ``args.ref_prompt_logp_column`` = ``l_ref(s)``: the model as given (the frozen start), before
    any update, through the same fused kernel that later yields ``l_theta(s)`` (so Query-KL is exactly 0 at step 0
    where both are computed in the same precision; docs/algorithms.md says what bf16 training of a float32-loaded
    policy starts from).
    A column already there (``trl-variants presample``, or the user's) is checked, not recomputed. A stream is read
    once (``_data.run_on_rows``)."""
    column = trainer.args.ref_prompt_logp_column
    if dataset is None:
        return dataset
    if split == "eval" and column not in (dataset.column_names or []) and trainer.state.global_step > 0:
        raise ValueError(
            f"{type(trainer).__name__}.evaluate: this eval_dataset has no {column!r} column (the prompts' "
            "log-likelihood under the starting model, read by Query-KL and the reference query weights), and after "
            f"{trainer.state.global_step} optimizer steps the model no longer is that starting model. Pass the "
            f"dataset as {type(trainer).__name__}(eval_dataset=...) (a dict of several is fine), or add the column "
            "with `trl-variants presample --num_samples 0 --record_prompt_logp true`")
    out, table = run_on_rows(dataset, lambda rows: _with_reference_prompt_logps(trainer, rows), [column],
                             "ERPO's reference pass")
    if split == "train":
        ref = torch.tensor(table[column], dtype=torch.float64)
        trainer._ref_prompt_logp_mean = ref.mean().item()
        trainer.defer_log({"ref_prompt_logp_mean": trainer._ref_prompt_logp_mean, "num_prompts": len(ref)})
    return out


def _with_reference_prompt_logps(trainer, dataset):
    """``dataset`` with ``l_ref(s)``: the column already there (``trl-variants presample``, or the user's own),
    checked, or computed now by the reference pass."""
    column = trainer.args.ref_prompt_logp_column
    fix = "recompute it (drop the column and the trainer runs the reference pass)"
    return stored_or_computed(trainer, dataset, [column], lambda rows: _reference_pass(trainer, rows),
                              check=lambda rows: check_finite_column(rows, column, fix),
                              temperature=trainer.temperature)


def _reference_pass(trainer, dataset):
    def fused_scorer(ids, mask):
        device = trainer.accelerator.device
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids.to(device), mask.to(device), ids.size(1) - 1)
        return logps

    with torch.no_grad(), full_parameters(trainer), on_accelerator_device(trainer):
        return add_reference_prompt_logps(
            dataset, trainer.model, trainer.processing_class, column=trainer.args.ref_prompt_logp_column,
            temperature=trainer.temperature, batch_size=trainer.args.reference_batch_size,
            accelerator=trainer.accelerator, token_logps_fn=fused_scorer,
            tokenize_fn=lambda prompts: trainer_prompt_ids(trainer, prompts),
        )


REFERENCE_PROMPT_LOGP = MappingProxyType({"ref_prompt_logp": provide_reference_prompt_logps})


def check_stored_reference(trainer_name, args, train_dataset) -> None:
    """A stored ``l_ref(s)`` column (``args.ref_prompt_logp_column``) holds values the offline pass can have made
    (a sum of log-probs: finite, <= 0); refused before anything loads."""
    check_stored_columns(train_dataset, trainer_name, None, {"ref_prompt_logp": args.ref_prompt_logp_column})


def _mode(trainer) -> str:
    return "train" if trainer.model.training else "eval"


# -------------------------------------------------------------------------------- 1. query weights ---
@register_part
class QueryWeights(Part):
    """Advantages times ``w_B(s)`` (eq. 8); metrics ``erpo/query_weight/{mean,min,max}``, ``erpo/prompt_logp/mean``."""

    name = "erpo_query_weights"
    citation, tag = ERPO, "erpo"  # model cards

    def __init__(self, source: str = "policy"):
        self.source = source
        self.needs = REFERENCE_PROMPT_LOGP if source == "reference" else MappingProxyType({})

    @classmethod
    def from_config(cls, args) -> QueryWeights:
        return cls(args.query_weight_source)

    def check(self, trainer_name, args, train_dataset, kwargs) -> None:
        if self.needs:  # the reference weights read l_ref(s)
            check_stored_reference(trainer_name, args, train_dataset)

    def after_scoring(self, trainer, inputs, output) -> None:
        weights = self.weights(trainer, inputs, output)
        output["advantages"] = output["advantages"] * weights
        metrics, all_w = trainer._metrics[_mode(trainer)], trainer.accelerator.gather(weights)
        metrics["erpo/query_weight/mean"].append(all_w.mean().item())
        metrics["erpo/query_weight/min"].append(all_w.min().item())
        metrics["erpo/query_weight/max"].append(all_w.max().item())

    def weights(self, trainer, inputs, output) -> torch.Tensor:
        """w_B(s) for each local row (rows of one prompt share it)."""
        args, device = trainer.args, trainer.accelerator.device
        if self.source == "reference":
            l_ref = torch.tensor([x[args.ref_prompt_logp_column] for x in inputs], device=device)
            return losses.reference_query_weights(l_ref, trainer._ref_prompt_logp_mean, args.query_weight_max)
        # l(s) under the rollout weights (= current policy, stop-gradient), one forward per distinct local prompt.
        prompt_ids, prompt_mask = output["prompt_ids"], output["prompt_mask"]
        new_prompt = torch.ones(prompt_ids.size(0), dtype=torch.bool, device=device)
        new_prompt[1:] = (prompt_ids[1:] != prompt_ids[:-1]).any(-1)
        first_rows = new_prompt.nonzero().squeeze(-1)
        with torch.no_grad():
            logps, _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, prompt_ids[first_rows], prompt_mask[first_rows], prompt_ids.size(1) - 1,
                batch_size=args.per_device_train_batch_size,
            )
        valid = prompt_mask[first_rows, 1:] * prompt_mask[first_rows, :-1]
        l_distinct = (logps * valid).sum(-1).float()
        l_rows = l_distinct[new_prompt.long().cumsum(0) - 1]  # each row takes its prompt's value
        # mean over the distinct prompts of the global batch: groups are G consecutive rows of the gathered batch
        mode = _mode(trainer)
        G = trainer.num_generations if mode == "train" else trainer.num_generations_eval
        l_all = trainer.accelerator.gather(l_rows)
        distinct = l_all[::G]
        trainer._metrics[mode]["erpo/prompt_logp/mean"].append(distinct.mean().item())
        w_all = losses.query_weights(distinct).repeat_interleave(G)
        rank = trainer.accelerator.process_index
        return w_all[rank * l_rows.numel() : (rank + 1) * l_rows.numel()]


# ---------------------------------------------------------------------------------------- 2. Query-KL ---
@register_part
class QueryKL(Part):
    """``+ alpha * mean_s k3(l_ref(s) - l_theta(s))`` (eq. 10-11), the loss term ``erpo_query_kl`` (logged as
    ``loss/erpo_query_kl``); metrics ``erpo/query_kl`` (the mean k3, without alpha), ``erpo/policy_prompt_logp/mean``.
    The term acts on the prompt, so it is not 0 when every completion is masked."""

    name = "erpo_query_kl"
    citation, tag = ERPO, "erpo"  # model cards
    needs = REFERENCE_PROMPT_LOGP
    wants_prompt_logps = True

    def __init__(self, coef: float, estimator: str = "k3"):
        self.coef, self.estimator = coef, estimator

    @classmethod
    def from_config(cls, args) -> QueryKL:
        return cls(args.query_kl_coef, args.query_kl_estimator)

    def check(self, trainer_name, args, train_dataset, kwargs) -> None:
        check_stored_reference(trainer_name, args, train_dataset)

    def after_scoring(self, trainer, inputs, output) -> None:
        output["ref_prompt_logps"] = torch.tensor(
            [x[trainer.args.ref_prompt_logp_column] for x in inputs], dtype=torch.float32,
            device=trainer.accelerator.device)

    def loss(self, trainer, model, inputs, forward):
        l_theta = forward.prompt_logps
        per_prompt = losses.query_kl(l_theta, inputs["ref_prompt_logps"], self.estimator)
        # Row mean = mean over distinct prompts when the step sees whole groups (each prompt has G rows).
        metrics, gather = trainer._metrics[_mode(trainer)], trainer.accelerator.gather
        metrics["erpo/query_kl"].append(gather(per_prompt.detach()).mean().item())
        metrics["erpo/policy_prompt_logp/mean"].append(gather(l_theta.detach()).mean().item())
        return {"erpo_query_kl": self.coef * per_prompt.mean()}  # on the rollout batch


def erpo_parts(args) -> list[Part]:
    """The parts an :class:`~trl_variants.ERPOConfig` turns on."""
    parts: list[Part] = []
    if args.use_query_weights:
        parts.append(QueryWeights(args.query_weight_source))
    if args.query_kl_coef > 0:
        parts.append(QueryKL(args.query_kl_coef, args.query_kl_estimator))
    return parts
