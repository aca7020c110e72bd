"""Configuration of :class:`~trl_variants.ERPOTrainer`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._config_checks import check_common, check_number, refuse_inert
from ..dapo.config import DynamicSamplingConfig


@dataclass
class ERPOConfig(DynamicSamplingConfig):
    r"""
    Configuration for [`ERPOTrainer`]: GRPO plus ERPO's query-weighted advantages and Query-KL ("Beyond the
    Stability-Exploration Dilemma: Environmental Regularization for LLM Policy Optimization", an anonymous preprint
    without arXiv id, Sec. 4; equations and defaults in docs/algorithms.md).

    Every [`~trl.GRPOConfig`] field applies. Defaults follow the paper: Query-KL coefficient ``alpha = 0.01`` with the
    k3 estimator, policy KL ``beta = 0`` (Query-KL replaces it), temperature 1.0, 8 rollouts per prompt. With
    ``use_query_weights=False`` and ``query_kl_coef=0`` the trainer is exactly GRPOTrainer.

    Parameters:
        use_query_weights (`bool`, defaults to `True`):
            Multiply the advantages of every completion of prompt ``s`` by ``w_B(s) = mean_B(l) / l(s)`` (eq. 8),
            ``l(s)`` the prompt log-likelihood. Paper ablation "GRPO + w(s)" when ``query_kl_coef = 0``.
        query_weight_source (`str`, defaults to `"policy"`):
            ``"policy"``: ``l`` from the current policy (rollout weights, stop-gradient), mean over the distinct prompts
            of the generation batch on all processes. ``"reference"`` (later version of the paper): fixed weights
            ``clip(mean_dataset(l_ref) / l_ref(s), 0, query_weight_max)`` from the reference pass.
        query_weight_max (`float`, defaults to `2.0`):
            Upper clip of the reference-derived weights.
        query_kl_coef (`float`, defaults to `0.01`):
            ``alpha``: coefficient of the Query-KL term ``alpha * mean_s k(l_ref(s) - l_theta(s))`` (eq. 10-11).
            ``0`` disables it (paper ablation "GRPO + w(s)").
        query_kl_estimator (`str`, defaults to `"k3"`):
            ``"k3"``: ``exp(d) - d - 1`` (``d`` clamped to [-20, 20], the result to at most 10); ``"k1"``:
            ``-d`` (eq. 11 literally).
        ref_prompt_logp_column (`str`, defaults to `"ref_prompt_logp"`):
            Dataset column holding ``l_ref(s)``. When absent, the trainer computes it once before training from the
            model it was given (the frozen starting policy); ``trl-variants presample`` can precompute it.
        reference_batch_size (`int`, defaults to `8`):
            Prompts per forward pass in that one-off reference pass.
    """

    use_query_weights: bool = field(
        default=True, metadata={"help": "Multiply each prompt's advantages by w_B(s) = mean_B(l) / l(s) (eq. 8)."}
    )
    query_weight_source: str = field(
        default="policy",
        metadata={"help": "'policy' (current policy, per batch) or 'reference' (fixed, clipped to query_weight_max).",
                  "choices": ["policy", "reference"]},
    )
    query_weight_max: float = field(default=2.0, metadata={"help": "Upper clip of reference-derived query weights."})
    query_kl_coef: float = field(
        default=0.01, metadata={"help": "alpha, the Query-KL coefficient (eq. 10); 0 disables Query-KL."}
    )
    query_kl_estimator: str = field(
        default="k3", metadata={"help": "Query-KL estimator: 'k3' or 'k1'.", "choices": ["k3", "k1"]}
    )
    ref_prompt_logp_column: str = field(
        default="ref_prompt_logp", metadata={"help": "Dataset column with the reference prompt log-likelihood."}
    )
    reference_batch_size: int = field(default=8, metadata={"help": "Prompts per forward in the reference pass."})

    # own fields a resume may change (_checkpoint.resume_fields): a column name, the batching of a no-grad pass
    resume_free_fields = frozenset({"ref_prompt_logp_column", "reference_batch_size"})

    def __post_init__(self):
        check_common(self)  # options TRL accepts but that fail after the model load
        super().__post_init__()
        self._check_erpo_options()

    def _check_erpo_options(self) -> None:
        """ERPO's own checks (a ComposedConfig runs them when one of ERPO's parts is in its parts)."""
        if self.query_weight_source not in ("policy", "reference"):
            raise ValueError(
                f"query_weight_source must be 'policy' or 'reference', got {self.query_weight_source!r}"
            )
        if self.query_kl_estimator not in ("k3", "k1"):
            raise ValueError(f"query_kl_estimator must be 'k3' or 'k1', got {self.query_kl_estimator!r}")
        # a NaN passed "< 0" and turned Query-KL off without a word (its part runs only for alpha > 0)
        check_number(self, "query_kl_coef", low=0, label="(alpha)", fix="0 turns Query-KL off; the paper's alpha is "
                     "0.01")
        check_number(self, "query_weight_max", low=0, low_open=True, fix="the upper clip of the reference-derived "
                     "weights, 2.0 by default")
        if self.reference_batch_size < 1:
            raise ValueError(f"reference_batch_size must be >= 1, got {self.reference_batch_size}")
        # an option that changes nothing in this configuration is refused rather than ignored (set to a non-default)
        why = {"query_kl_estimator": "does nothing with query_kl_coef=0 (Query-KL off): set query_kl_coef > 0 or drop "
                                     "query_kl_estimator",
               "query_weight_source": "does nothing with use_query_weights=False: set use_query_weights=True or drop "
                                      "query_weight_source",
               "query_weight_max": "clips only the reference-derived weights: set query_weight_source='reference' "
                                   "(with use_query_weights=True) or drop query_weight_max"}
        inert = self.inert_fields(vars(self))
        refuse_inert(self, {name: text for name, text in why.items() if name in inert})

    @staticmethod
    def inert_fields(values) -> set[str]:
        """ERPO's fields that change nothing given the others (``values``: field values, e.g. a checkpoint's record).
        Set to a non-default they are refused (above); a resume does not compare a field inert in both runs."""
        weights = values.get("use_query_weights", True)
        inert = set()
        if values.get("query_kl_coef", 0.01) == 0:
            inert.add("query_kl_estimator")
        if not weights:
            inert.add("query_weight_source")
        if not (weights and values.get("query_weight_source", "policy") == "reference"):
            inert.add("query_weight_max")
        return inert
