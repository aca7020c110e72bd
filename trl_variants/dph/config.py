"""Configuration of :class:`~trl_variants.DPHTrainer`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._config_checks import check_common, check_number, refuse_inert
from .._validation import check_cache_dir, reward_func_names
from ..dapo.config import DynamicSamplingConfig
from ..losses import DIVERGENCES


@dataclass
class DPHConfig(DynamicSamplingConfig):
    r"""
    Configuration for [`DPHTrainer`]: DPH-RL ("The Choice of Divergence: A Neglected Key to Mitigating Diversity
    Collapse in Reinforcement Learning with Verifiable Reward", arXiv 2509.07430, Sec. 4, App. C, F, G; equations and
    defaults in docs/algorithms.md).

    GRPO without KL on the exploration prompts D_exp, plus ``eta`` times a mass-covering f-divergence (generator
    form) on stored reference completions of the near-perfect prompts D_pef. Defaults: JS with ``eta = 0.2``
    (Table 6), "8 of 8" split (k = 8, threshold 8, keep all correct completions), refinement off, one D_pef row per
    8 rollout rows (the paper's 256 per 2048). ``beta`` (GRPOConfig's KL to the reference on D_exp rollouts) stays 0
    as in eq. 5; a value > 0 adds GRPO's own KL term on D_exp (an addition, not the paper's; GRPOTrainer then loads a
    reference model), in the generator form only.

    Parameters:
        divergence (`str`, defaults to `"js"`):
            ``forward_kl``, ``reverse_kl``, ``js``, ``alpha`` or ``forward_kl_k3`` (see ``losses.f_divergence``).
        divergence_alpha (`float`, defaults to `0.2`): the alpha of the alpha-divergence.
        dph_coef (`float`, *optional*): eta, weight of the D_pef term. Default: the paper's for the divergence
            (Table 6): 0.2 for ``js``, 0.01 for ``forward_kl`` and ``alpha`` (and for ``forward_kl_k3`` and
            ``reverse_kl``, which the paper does not train with).
        loss_combination (`str`, defaults to `"sum"`): how the trainer combines the loss of each batch (the parts
            return named terms; docs/parts.md). ``"sum"``: ``L_exp + eta * L_pef`` (eq. 7), each a mean over its own
            subset; ``"count_weighted"``: ``(n_exp L_exp + eta n_pef L_pef) / (n_exp + n_pef)`` with n the rows of
            each subset in the micro-batch (what the authors' code effectively does). ``L_exp`` is GRPO's loss plus
            every term on the rollouts, whatever the order of the parts.
        num_presamples (`int`, defaults to `8`): k, reference samples per prompt in the offline pass.
        pef_threshold (`int`, defaults to `8`): a prompt with at least this many correct of k goes to D_pef.
        correctness_reward (`str` or the reward function, *optional*): the name of the reward function that decides
            whether a reference sample is correct (its own value, not the weighted sum); the function itself is
            stored as its name. Default: ``accuracy_reward`` when it is one of
            the reward functions, else the only reward function; with several and none of them ``accuracy_reward``
            the trainer asks you to name one. A format reward must not make a wrong answer "correct".
        correctness_threshold (`float`, defaults to `1.0`): a sample is correct when that function's reward is at
            least this (the paper: the accuracy reward equals 1). A sample without a reward is never correct.
        pef_keep (`str`, defaults to `"all"`): keep ``"all"`` correct reference completions or ``"one"``.
        pef_refine (`bool`, defaults to `False`): draw one more sample per D_pef prompt; keep it in D_pef only if
            correct (Sec. 4.1).
        drop_unsolved (`bool`, defaults to `False`): drop the prompts none of the k reference samples solves before
            training (the paper's math runs filter Pass@8 = 0 out of DAPO-17K, App. G.1). Off by default: a TRL
            trainer trains on the ``train_dataset`` it is given, and dropping rows is the caller's choice (the paper
            recipe turns it on; the split's ``num_unsolved_dropped`` is logged). Such prompts otherwise sit in
            D_exp, where a group with all rewards 0 has zero advantage.
        pef_batch_size (`int`, *optional*): D_pef rows per micro-step per process; default
            ``max(1, per_device_train_batch_size // 8)``.
        require_pef (`bool`, defaults to `False`): raise when the split leaves D_pef empty; otherwise the trainer
            warns and runs as GRPO without KL.
        presample_cache_dir (`str`, *optional*): cache of the offline pass (default
            ``~/.cache/trl_variants/presample``).
        presample_generation_batch_size (`int`, defaults to `64`): sequences per ``generate`` call in the offline
            pass. Part of the pass's fixed layout (and cache key): never derived from the per-device batch, so the
            reference samples are the same with 1 or N processes.
        divergence_form (`str`, defaults to `"generator"`): ``"generator"`` (eq. 6, no reference model) or
            ``"definition"`` (App. F, JS only): ``KL(pi_ref || M)`` on D_pef and ``beta1 * KL(pi_theta || M)`` on
            D_exp rollouts, ``M = (pi_ref + pi_theta) / 2``, ``beta1 = eta |D_pef| / |D_exp|``, with a live
            reference model (sample-based per-token estimates on each set's own samples).
    """

    divergence: str = field(default="js", metadata={"help": f"One of {DIVERGENCES}.", "choices": list(DIVERGENCES)})
    divergence_alpha: float = field(default=0.2, metadata={"help": "alpha of the alpha-divergence."})
    dph_coef: float | None = field(default=None, metadata={
        "help": "eta: weight of the D_pef divergence term (default: 0.2 for js, 0.01 for the other divergences)."})
    loss_combination: str = field(default="sum", metadata={"help": "'sum' (eq. 7) or 'count_weighted'.",
                                                           "choices": ["sum", "count_weighted"]})
    num_presamples: int = field(default=8, metadata={"help": "k: reference samples per prompt."})
    pef_threshold: int = field(default=8, metadata={"help": "Correct samples (of k) that make a prompt D_pef."})
    correctness_reward: str | None = field(
        default=None, metadata={"help": "Reward function deciding correctness (default accuracy_reward)."})
    correctness_threshold: float = field(
        default=1.0, metadata={"help": "A reference sample is correct when that reward is >= this."})
    pef_keep: str = field(default="all", metadata={"help": "'all' or 'one' correct completion per D_pef prompt.",
                                                   "choices": ["all", "one"]})
    pef_refine: bool = field(default=False, metadata={"help": "Refinement draw for D_pef prompts (Sec. 4.1)."})
    drop_unsolved: bool = field(
        default=False, metadata={"help": "Drop prompts with 0 of k correct reference samples (App. G.1's Pass@8 = 0 "
                                         "filter) instead of keeping them in D_exp."})
    pef_batch_size: int | None = field(default=None, metadata={"help": "D_pef rows per micro-step per process."})
    require_pef: bool = field(default=False, metadata={"help": "Error instead of GRPO fallback if D_pef is empty."})
    presample_cache_dir: str | None = field(default=None, metadata={"help": "Cache directory of the offline pass."})
    presample_generation_batch_size: int = field(
        default=64, metadata={"help": "Sequences per generate call in the offline pass (fixed layout)."})
    divergence_form: str = field(default="generator", metadata={"help": "'generator' (eq. 6) or 'definition' "
                                                                        "(App. F, JS with a live reference).",
                                                                "choices": ["generator", "definition"]})

    # own fields a resume may change (_checkpoint.resume_fields): where the offline pass is cached (its key holds
    # what matters), an error instead of a fallback
    resume_free_fields = frozenset({"presample_cache_dir", "require_pef"})
    # rows per micro-step per process: on another number of processes it may change, its global rows per step not
    per_process_batch_fields = ("pef_batch_size",)

    def __post_init__(self):
        check_common(self)  # options TRL accepts but that fail after the model load
        super().__post_init__()
        self._check_dph_options()

    @staticmethod
    def default_eta(divergence: str) -> float:
        """``dph_coef``'s default for ``divergence`` (Table 6): 0.2 for DPH-JS, 0.01 for DPH-F and the
        alpha-divergence (and for the divergences the paper does not train with)."""
        return 0.2 if divergence == "js" else 0.01

    def _check_dph_options(self) -> None:
        """DPH-RL's own checks (a ComposedConfig runs them when its parts hold dph_rehearsal)."""
        check_cache_dir(self.presample_cache_dir, type(self).__name__, "presample_cache_dir")
        if self.correctness_reward is not None and not isinstance(self.correctness_reward, str):
            # the reward function itself, as reward_funcs takes it: the name TRL gives it (a str keeps the config
            # JSON for checkpoints and the Hub)
            self.correctness_reward = reward_func_names([self.correctness_reward])[0]
        if self.divergence not in DIVERGENCES:
            raise ValueError(f"divergence must be one of {DIVERGENCES}, got {self.divergence!r}")
        if self.dph_coef is None:
            self.dph_coef = self.default_eta(self.divergence)
        if self.divergence == "alpha":
            check_number(self, "divergence_alpha", fix="the alpha of the alpha-divergence, 0.2 by default")
            if self.divergence_alpha in (0.0, 1.0):
                raise ValueError("divergence_alpha must not be 0 or 1 (those limits are the KL divergences: "
                                 "divergence='reverse_kl' and 'forward_kl')")
        else:
            refuse_inert(self, {"divergence_alpha": f"is read only by divergence='alpha' (this is "
                                                    f"{self.divergence!r}): set divergence='alpha' or drop it"})
        if self.loss_combination not in ("sum", "count_weighted"):
            raise ValueError(f"loss_combination must be 'sum' or 'count_weighted', got {self.loss_combination!r}")
        check_number(self, "dph_coef", low=0, label="(eta)", fix="it weighs the D_pef divergence; the paper's 0.2 for js, "
                     "0.01 for the others")
        check_number(self, "correctness_threshold", fix="a reference sample is correct when its reward is at least "
                     "this; 1.0 for accuracy_reward")
        if self.num_presamples < 1 or not 1 <= self.pef_threshold <= self.num_presamples:
            raise ValueError(f"need 1 <= pef_threshold <= num_presamples, got pef_threshold={self.pef_threshold}, "
                             f"num_presamples={self.num_presamples}")
        if self.presample_generation_batch_size < 1:
            raise ValueError(f"presample_generation_batch_size must be >= 1, got {self.presample_generation_batch_size}")
        if self.pef_keep not in ("all", "one"):
            raise ValueError(f"pef_keep must be 'all' or 'one', got {self.pef_keep!r}")
        if self.pef_batch_size is None:
            self.pef_batch_size = max(1, self.per_device_train_batch_size // 8)
        if self.pef_batch_size < 1:
            raise ValueError(f"pef_batch_size must be >= 1, got {self.pef_batch_size}")
        if self.divergence_form not in ("generator", "definition"):
            raise ValueError(f"divergence_form must be 'generator' or 'definition', got {self.divergence_form!r}")
        if self.divergence_form == "definition" and self.divergence != "js":
            raise ValueError("divergence_form='definition' is App. F's JS method: set divergence='js' (for the other "
                             "divergences the definition and generator forms coincide)")
        if self.beta != 0.0 and self.divergence_form == "definition":
            raise ValueError(f"with divergence_form='definition' beta must be 0, got {self.beta}: that form's D_exp term "
                             "is App. F's beta1 * KL(pi_theta || M), computed from the live reference, and GRPO's KL "
                             "would be a second one. Use the generator form to add GRPO's KL on D_exp")
