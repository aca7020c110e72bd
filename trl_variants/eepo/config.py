"""Configuration of :class:`~trl_variants.EEPOTrainer`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._config_checks import check_common, check_number, refuse_inert
from ..dapo.config import DynamicSamplingConfig


def check_whole_groups(per_device_train_batch_size: int, steps_per_generation: int, num_generations: int) -> None:
    """Each process must generate whole groups (stage 2 of a prompt follows its own stage 1 on the same process)."""
    rows = per_device_train_batch_size * steps_per_generation
    if rows % num_generations:
        raise ValueError(
            f"EEPO needs whole groups on every process: per_device_train_batch_size * steps_per_generation = "
            f"{per_device_train_batch_size} * {steps_per_generation} = {rows} is not a multiple of num_generations = "
            f"{num_generations}; change per_device_train_batch_size (or gradient_accumulation_steps / "
            "steps_per_generation) so that it is"
        )


@dataclass
class EEPOConfig(DynamicSamplingConfig):
    r"""
    Configuration for [`EEPOTrainer`]: GRPO with two-stage sample-then-forget rollouts ("EEPO: Exploration-Enhanced
    Policy Optimization via Sample-Then-Forget", arXiv 2510.05837, Sec. 3, Algorithm 1; equations and defaults in
    docs/algorithms.md).

    Every [`~trl.GRPOConfig`] field applies. Paper defaults: ``entropy_threshold`` (alpha) 0.3, ``entropy_window``
    (m) 3, ``unlearning_lr`` (eta) 3e-3, 8 rollouts (4 per stage; an odd G gives stage 1 the larger half, e.g.
    2 + 1 for G = 3). The paper gives no values for the probability clip
    ``[eps_L, 1 - eps_R]``; the defaults here (``unlearning_eps_low = 1e-6``, ``unlearning_eps_high = 1e-3``) are
    chosen on evidence, see docs/eepo.md: a large ``eps_R`` zeroes the gradient of exactly the dominant tokens the step
    exists to suppress (the paper defines the clip only "for numerical stability as pi_rollout -> 1", eq. 8). Even
    1e-3 exempts most tokens of a very peaked model (84% on the tiny default); ``unlearning_eps_high=1e-4`` pushes
    harder at the price of larger per-token gradients.

    The policy KL (``beta``) and the entropy bonus (``entropy_coef``) keep GRPOConfig's defaults (0), so that EEPO
    with ``entropy_gate="never"`` is exactly GRPOTrainer with the same arguments. The paper trains with ``beta = 1e-4``
    and ``entropy_coef = 1e-5`` (App. A, "The KL loss and entropy loss coefficient are set to 1e-4 and 1e-5"); the
    paper recipe ``configs/eepo/qwen2.5-3b.yaml`` sets both.

    Parameters:
        entropy_gate (`str`, defaults to `"auto"`):
            ``"auto"``: unlearn when the m-step moving average of stage-1 token entropy is below ``entropy_threshold``;
            ``"always"`` / ``"never"``: force it (ablations; ``"never"`` is exactly GRPOTrainer).
        entropy_threshold (`float`, defaults to `0.3`): alpha of eq. 4-5.
        entropy_window (`int`, defaults to `3`): m, the moving-average window (in generation steps).
        unlearning_lr (`float`, defaults to `3e-3`): eta, step size of the single plain gradient step.
        unlearning_eps_low (`float`, defaults to `1e-6`): eps_L of eq. 8 (probabilities below are not penalised).
        unlearning_eps_high (`float`, defaults to `1e-3`): eps_R of eq. 8 (keeps ``1 - p`` away from 0).
        capture_stage2_logps (`bool` or `None`, defaults to `None`): where stage 2's old log-probs (and entropy)
            come from. They are the unlearned model's log-probs of the stage-2 tokens, softmax(logits / T) before any
            logits processor. ``None``: read from the model's own forward passes while ``generate`` samples stage 2
            (no separate forward) when that gives the separate forward's values (transformers ``generate``, float32
            weights, no bf16 / fp16, no beam search, static rotary position embeddings, no dropout left on; a static
            KV cache, ``cache_implementation="static"``, included), else a separate no-grad forward after generation
            (vLLM, continuous batching, which says so in a warning naming ``use_transformers_continuous_batching``,
            half precision, GPT-2-style absolute positions, ...; docs/eepo.md). With ``entropy_gate="auto"`` the same applies to stage 1's
            entropy for the gate, so a closed gate runs no forward. ``True``: always read while generating
            (refused with vLLM or continuous batching, whose engines do not run the trainer's module; in half
            precision the values differ from a forward by the usual generation/training rounding); ``False``:
            always the separate forward. On the command line: ``--capture_stage2_logps true`` / ``false``.
    """

    entropy_gate: str = field(default="auto", metadata={"help": "'auto', 'always' or 'never'.",
                                                        "choices": ["auto", "always", "never"]})
    entropy_threshold: float = field(default=0.3, metadata={"help": "alpha: unlearn when mean entropy < alpha."})
    entropy_window: int = field(default=3, metadata={"help": "m: moving-average window of the entropy gate."})
    unlearning_lr: float = field(default=3e-3, metadata={"help": "eta: learning rate of the unlearning step."})
    unlearning_eps_low: float = field(default=1e-6, metadata={"help": "eps_L: lower probability clip (eq. 8)."})
    unlearning_eps_high: float = field(default=1e-3, metadata={"help": "eps_R: p is clipped to at most 1 - eps_R."})
    capture_stage2_logps: bool | None = field(
        default=None, metadata={"help": "Stage 2's old log-probs read while generating instead of a separate forward. "
                                        "None (default): when that gives the forward's values (transformers "
                                        "generate, float32); True: always (refused with vLLM / continuous "
                                        "batching); False: never."})

    # own fields a resume may change (_checkpoint.resume_fields): where stage 2's log-probs are read, not their
    # values (float32 rounding apart)
    resume_free_fields = frozenset({"capture_stage2_logps"})

    def __post_init__(self):
        check_common(self)  # options TRL accepts but that fail after the model load
        super().__post_init__()
        self._check_eepo_options()

    def _check_eepo_options(self) -> None:
        """EEPO's own checks (a ComposedConfig runs them when its parts hold eepo_two_stage_rollout)."""
        if self.entropy_gate not in ("auto", "always", "never"):
            raise ValueError(f"entropy_gate must be 'auto', 'always' or 'never', got {self.entropy_gate!r}")
        check_whole_groups(self.per_device_train_batch_size, self.steps_per_generation, self.num_generations)
        if self.entropy_window < 1:
            raise ValueError(f"entropy_window must be >= 1, got {self.entropy_window}")
        check_number(self, "unlearning_lr", low=0, low_open=True, label="(eta)", fix="the learning rate of the "
                     "unlearning step, 3e-3 in the paper")
        # the gate opens when the mean entropy (>= 0) falls below it: NaN or <= 0 never opened it, without a word
        check_number(self, "entropy_threshold", low=0, low_open=True, label="(alpha)", fix="0.3 in the paper; to "
                     "never unlearn set entropy_gate='never'")
        if not (0.0 <= self.unlearning_eps_low < 1.0 - self.unlearning_eps_high <= 1.0):
            raise ValueError("need 0 <= unlearning_eps_low < 1 - unlearning_eps_high <= 1, got "
                             f"unlearning_eps_low={self.unlearning_eps_low}, unlearning_eps_high={self.unlearning_eps_high}")
        inert = {}  # an option that changes nothing given the gate: refused rather than ignored (set to a non-default)
        if self.entropy_gate != "auto":
            inert.update({name: f"is read only by entropy_gate='auto' (the gate; this is {self.entropy_gate!r}): set "
                                "entropy_gate='auto' or drop it" for name in ("entropy_threshold", "entropy_window")})
        if self.entropy_gate == "never":
            inert.update({name: "does nothing with entropy_gate='never' (no unlearning step: GRPO): set entropy_gate "
                                "to 'auto' or 'always', or drop it"
                          for name in ("unlearning_lr", "unlearning_eps_low", "unlearning_eps_high")})
        refuse_inert(self, inert)
        if self.capture_stage2_logps and (self.use_vllm or self.use_transformers_continuous_batching):
            engine = "use_vllm" if self.use_vllm else "use_transformers_continuous_batching"
            raise ValueError(f"capture_stage2_logps=True with {engine}: that engine does not run the trainer's module, "
                             "so stage 2's log-probs cannot be read while generating. Leave capture_stage2_logps "
                             "unset (None) or False: stage 2 is then scored in a separate forward")
