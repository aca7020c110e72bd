"""What keeps a run numerically sound on any device: weights that can move, and a stop with a clear message at the
first non-finite loss, gradient, weight or logit, before the damage spreads.

**Weights that move.** An optimizer that updates bf16 or fp16 parameters directly loses every update smaller than
the weights' resolution (bf16 keeps 8 significant bits: at a weight of 0.02 an update below ~1e-4 rounds away), and
the paper recipes train at learning rates of 1e-6 to 2e-7. DeepSpeed (with bf16/fp16 on) and FSDP with mixed
precision keep an fp32 master copy of the weights and are fine; DDP or a single process are not. So a policy that
would be *held* in bf16/fp16 with no master copy is, per ``low_precision_weights``: loaded in float32 instead (the
default, ``"upcast"``: with ``bf16``/``fp16`` on the compute stays in that precision through autocast), refused
(``"refuse"``), or trained as it is (``"allow"``). LoRA adapters are kept in float32 by PEFT, so a PEFT run is
never touched.

**Non-finite values.** transformers logs a non-finite loss as 0 and clips a non-finite gradient norm into NaN
gradients (``max_grad_norm / nan``), so one bad step turns every weight into NaN and the run dies later inside
``generate`` (on CUDA as a device-side assert: "probability tensor contains either inf, nan or element < 0"). Here
the run stops at the first of: a non-finite loss (every micro-step), non-finite gradients (before the optimizer
applies them), non-finite weights (after each update: the backstop under DeepSpeed, which applies its update inside
``backward``, and for an update that overflows), non-finite logits while generating (before anything is sampled
from them). Every process learns of it (one flag summed over processes), so all stop at the same step, and the
message names the step and what to do. Checks run on the guarded code paths only, through transformers' public
``TrainerCallback`` events; each costs one reduction over the tensors it reads.

**Log-probs in float32 under FSDP.** Accelerate's FSDP2 mixed precision casts every sharded module's output to the
compute dtype (``MixedPrecisionPolicy(output_dtype=bf16)``), so the per-token log-probs TRL's fused head computes in
float32 reach the losses rounded to bf16 (8 significant bits: at a log-prob of -5 a step of 0.03), unlike DDP with
autocast or DeepSpeed, where they stay float32. EEPO's unlearning loss was then infinite (its clip at ``1 - 1e-3``
rounds to 1 in bf16) and its first step made every weight NaN; ERPO's Query-KL (a rounding-level number at the first
step, where policy and reference agree) differed from ZeRO's. The trainers here keep float32
outputs (:func:`float32_outputs_under_fsdp`, through the FSDP plugin's public ``mixed_precision_policy``): the
parameters still gather and compute in bf16 and gradients still reduce in the plugin's dtype. The LM head still gets
its input in bf16 (:func:`head_input_in_its_dtype`: torch 2.11 would hand it float32).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import TrainerCallback
from trl import GRPOConfig

LOW_PRECISION_WEIGHTS = ("upcast", "refuse", "allow")
_LOW = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
        "half": torch.float16}


@dataclass
class GuardedConfig(GRPOConfig):
    r"""
    [`~trl.GRPOConfig`] plus the numerical guards every trainer here shares (see ``trl_variants/_numerics.py``).

    Parameters:
        low_precision_weights (`str`, defaults to `"upcast"`):
            What to do when the policy would be trained with bf16/fp16 weights and no fp32 master copy (no DeepSpeed
            with bf16/fp16, no FSDP with mixed precision), where updates smaller than the weights' resolution (most
            updates at lr 1e-6) vanish. ``"upcast"``: load the model in float32 (bf16/fp16 compute stays on through
            autocast when ``bf16``/``fp16`` is set); ``"refuse"``: stop before loading, naming the fix; ``"allow"``:
            train the low-precision weights as they are (e.g. with an optimizer that handles it).
    """

    low_precision_weights: str = field(
        default="upcast",
        metadata={"help": "bf16/fp16 weights without an fp32 master copy (no DeepSpeed / FSDP mixed precision): "
                          "'upcast' loads the model in float32 (autocast keeps bf16/fp16 compute), 'refuse' stops, "
                          "'allow' trains them as they are (updates below their resolution are lost).",
                  "choices": list(LOW_PRECISION_WEIGHTS)},
    )

    # transformers before 5.8 defaults trackio_space_id to "trackio": `report_to: trackio` then deploys a public
    # Space (and fails offline); from 5.8 trackio logs to a local directory unless a Space is named, on every version
    trackio_space_id: str | None = field(
        default=None, metadata={"help": "Hugging Face Space for live Trackio logging; None: a local directory only."})

    def __post_init__(self):
        super().__post_init__()
        if self.low_precision_weights not in LOW_PRECISION_WEIGHTS:
            raise ValueError(f"low_precision_weights must be one of {LOW_PRECISION_WEIGHTS}, got "
                             f"{self.low_precision_weights!r}")


# ------------------------------------------------------------------------------------------- master weights ---
def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def uses_deepspeed(args) -> bool:
    """The run trains under DeepSpeed: a ``deepspeed`` config in ``args``, or ``accelerate launch`` with a DeepSpeed
    config (``ACCELERATE_USE_DEEPSPEED``)."""
    return bool(getattr(args, "deepspeed", None)) or _env_true("ACCELERATE_USE_DEEPSPEED")


def uses_fsdp(args) -> bool:
    """Whether the run is under FSDP: ``args.fsdp``, or ``accelerate launch`` with an FSDP config."""
    return bool(getattr(args, "fsdp", None)) or _env_true("ACCELERATE_USE_FSDP")


def mixed_precision(args) -> str | None:
    """The run's low-precision compute, "bf16" or "fp16" (None without), as transformers' TrainingArguments resolves
    it: the config's ``fp16`` / ``bf16``, or else ``accelerate launch``'s (its config file's ``mixed_precision``,
    ``ACCELERATE_MIXED_PRECISION``; transformers keeps it as ``args.mixed_precision``). fp8 counts as bf16: Accelerate
    runs the rest of the model in bf16 autocast there, and FSDP keeps float32 master weights."""
    if args.fp16 or args.bf16:
        return "fp16" if args.fp16 else "bf16"
    for value in (getattr(args, "mixed_precision", None), os.environ.get("ACCELERATE_MIXED_PRECISION")):
        value = str(value or "no").strip().lower()
        if value in ("bf16", "fp16", "fp8"):
            return "bf16" if value == "fp8" else value
    return None


def has_master_weights(args) -> bool:
    """Whether the run keeps an fp32 master copy of low-precision weights: DeepSpeed with bf16/fp16 on (its mixed
    precision optimizer), or FSDP with mixed precision (Accelerate upcasts the trainable parameters to float32).
    Mixed precision from ``accelerate launch`` counts: transformers turns it on even with ``bf16: false``."""
    mixed = mixed_precision(args) is not None
    return mixed and (uses_deepspeed(args) or uses_fsdp(args))


def _low_dtype(value):
    """``torch.bfloat16`` / ``torch.float16`` when ``value`` (a dtype or its name) is one, else None."""
    if isinstance(value, torch.dtype):
        return value if value in (torch.bfloat16, torch.float16) else None
    return _LOW.get(str(value).removeprefix("torch.").lower()) if value is not None else None


def _trainable_low_dtype(model):
    """The low-precision dtype of ``model``'s trainable parameters (None when they are float32 or it has none)."""
    return next((p.dtype for p in model.parameters() if p.requires_grad and _low_dtype(p.dtype)), None)


def _requested_dtype(model: str, dtype):
    """The dtype a path will load in: ``dtype`` as given, or for ``"auto"`` the checkpoint's own (its config's
    ``dtype``, read without loading weights; None when the config cannot be read here)."""
    if str(dtype) != "auto":
        return dtype
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model)
    except (OSError, ValueError):
        return None
    return getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)


def _dtype_key(kwargs: dict) -> str:
    """The ``model_init_kwargs`` key that names the load dtype (``torch_dtype`` only where it alone is given)."""
    return "dtype" if "dtype" in kwargs or "torch_dtype" not in kwargs else "torch_dtype"


def _policy_low_dtype(model, args):
    """The bf16/fp16 dtype the policy would be held in (a path: the dtype of its ``model_init_kwargs``, TRL's float32
    when none is given; an object: its trainable parameters'), or None."""
    if not isinstance(model, str):
        return _trainable_low_dtype(model)
    kwargs = args.model_init_kwargs or {}
    return _low_dtype(_requested_dtype(model, kwargs.get(_dtype_key(kwargs))))


def check_master_weights(model, args, trainer_name: str, peft_config=None) -> None:
    """Apply ``args.low_precision_weights`` before the model loads (``model`` a path: its ``model_init_kwargs``
    ``dtype``) or before training starts (``model`` an object). ``"upcast"`` rewrites ``args.model_init_kwargs`` so
    GRPOTrainer loads the path in float32, with one printed line; an object in bf16/fp16 is refused (it is yours:
    call ``model.float()`` or pass its path)."""
    from peft import PeftModel

    mode = getattr(args, "low_precision_weights", "upcast")
    if mode == "allow" or peft_config is not None or isinstance(model, PeftModel) or has_master_weights(args):
        return
    low = _policy_low_dtype(model, args)
    if low is None:
        return
    name = str(low).removeprefix("torch.")
    why = (f"{trainer_name} would train {name} weights with no fp32 master copy (no DeepSpeed with bf16/fp16, no "
           f"FSDP with mixed precision): AdamW's updates at learning_rate={args.learning_rate:g} are mostly below "
           f"{name}'s resolution and vanish, so the weights barely move")
    compute = mixed_precision(args)
    if isinstance(model, str) and mode == "upcast":
        kwargs = dict(args.model_init_kwargs or {})
        kwargs[_dtype_key(kwargs)] = "float32"
        args.model_init_kwargs = kwargs
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"{trainer_name}: loading {model} in float32 instead of {name} ({why}); "
                  + (f"compute stays in {compute} through autocast. " if compute else
                     f"set --{'bf16' if low == torch.bfloat16 else 'fp16'} true for {name} compute. ")
                  + "Memory: 4 bytes a weight instead of 2, plus float32 gradients and optimizer states; for less, "
                  "train under DeepSpeed ZeRO (configs/accelerate/zero2.yaml), or set low_precision_weights: allow "
                  "to keep the weights as they are")
        return
    fix = ("pass the model as a path (it is then loaded in float32), call model.float() (with --bf16 true the "
           "compute stays in bf16 through autocast)" if not isinstance(model, str) else
           f"drop dtype: {name} (or set low_precision_weights: upcast) to load it in float32 with bf16/fp16 compute "
           "through autocast")
    raise ValueError(f"{why}. Fix: {fix}; or train under DeepSpeed ZeRO with bf16 (configs/accelerate/zero2.yaml), "
                     "which keeps fp32 master weights; or set low_precision_weights='allow' to train them as they are")


def check_fsdp_lm_head_cast(model, args, trainer_name: str, peft_config=None) -> None:
    """Refuse, before anything loads, ``cast_lm_head_to_fp32`` with a bf16/fp16 policy under FSDP and a reference
    model (``beta != 0``). TRL 1.16 casts the reference's ``lm_head`` to float32 and leaves the rest in bf16; FSDP2
    shards it without upcasting (evaluation mode) and refuses a module of mixed dtypes at the first rollout
    ("FSDP expects uniform original parameter dtype"), after the model load and the offline pass. TRL's own
    GRPOTrainer fails the same way. (The policy is upcast by Accelerate; DeepSpeed runs it.) Call after
    :func:`check_master_weights`, which may already have asked for float32."""
    if not (getattr(args, "cast_lm_head_to_fp32", False) and args.beta != 0 and uses_fsdp(args)):
        return
    from peft import PeftModel

    if peft_config is not None or isinstance(model, PeftModel):
        return  # no reference model: the adapters are turned off instead
    low = _policy_low_dtype(model, args)
    if low is None:
        return
    name = str(low).removeprefix("torch.")
    raise ValueError(
        f"{trainer_name}: cast_lm_head_to_fp32 with a {name} policy, beta={args.beta:g} (a reference model) and FSDP "
        "fails at the first rollout: TRL casts the reference model's lm_head to float32, and FSDP2 refuses a module "
        "whose parameters mix dtypes ('FSDP expects uniform original parameter dtype'); TRL's GRPOTrainer too. Fix: "
        "drop cast_lm_head_to_fp32 (under FSDP the trainers here keep the log-probs in float32 already), or load the "
        f"policy in float32 (dtype: float32; FSDP's {name} mixed precision still computes in {name}), or train under "
        "DeepSpeed ZeRO (configs/accelerate/zero2.yaml), where the cast works")


def float32_outputs_under_fsdp(accelerator, trainer_name: str) -> bool:
    """Under FSDP2 with Accelerate's mixed precision, make the modules' outputs float32 (module docstring): set
    ``output_dtype`` of the plugin's ``mixed_precision_policy`` before any model is prepared, with one printed line.
    Only Accelerate's own policy is changed (bf16/fp16 for parameters, reductions and outputs alike); a policy of
    your own with low-precision outputs is left as it is, with a warning. FSDP1's policy has no ``output_dtype``
    (nothing to do). The plugin lives on Accelerate's shared state: a later trainer in the same process that reuses
    this state (``accelerator_config.use_configured_state``) keeps the change. Returns whether it changed anything."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    policy = getattr(plugin, "mixed_precision_policy", None)
    low = getattr(policy, "output_dtype", None)
    if low not in (torch.bfloat16, torch.float16):
        return False
    name = str(low).removeprefix("torch.")
    if not (policy.param_dtype == low and policy.reduce_dtype in (low, None)):  # None: param_dtype's (torch 2.6)
        warnings.warn(f"{trainer_name}: the FSDP mixed precision policy {policy} is not Accelerate's default: its "
                      f"{name} output_dtype is kept, so the log-probs reach the losses in {name} (the methods' terms "
                      "lose precision; set output_dtype=torch.float32 to keep them in float32)", stacklevel=3)
        return False
    plugin.mixed_precision_policy = dataclasses.replace(policy, output_dtype=torch.float32)
    if accelerator.is_main_process:
        print(f"{trainer_name}: FSDP mixed precision with float32 module outputs (Accelerate's policy has {name}), so "
              f"that log-probs reach the losses in float32 as DeepSpeed hands them over; parameters still compute in "
              f"{name}")
    return True


def head_input_in_its_dtype(model, accelerator):
    """Under FSDP2 with float32 module outputs (:func:`float32_outputs_under_fsdp`), hand the LM head's forward its
    input in the dtype of its weights on every torch version. Accelerate 1.15 shards the final norm and the LM head
    as one unit, with the input embeddings when they are tied to the head (Qwen2.5-0.5B, SmolLM2). torch 2.11 casts
    a unit's inputs to the compute dtype only where its first module runs (torch 2.13 casts them at each module):
    a tied model's norm then got the decoder layers' float32 outputs, returned float32, and the bf16 head failed the
    first generate ("expected mat1 and mat2 to have the same dtype"; every trainer, one H100, 2026-11-28).

    A forward pre-hook on the head (``get_output_embeddings()``) casts its input to its weights' dtype at that moment:
    bf16 while FSDP runs it, float32 before FSDP shards the model (DPH-RL's and A*-PO's offline pass). FSDP's own
    pre-hook runs first, so under torch 2.13 the input is already bf16 and nothing changes. TRL's fused head, which
    reads the backbone's output and the head's weights without the head's forward, is left as it was: it gets the
    float32 output on both versions and computes its log-probs in float32. Returns the hook's handle, or None where
    none is needed (no FSDP2 mixed precision with float32 outputs, or no head)."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    policy = getattr(plugin, "mixed_precision_policy", None)
    low = getattr(policy, "param_dtype", None)
    if low not in (torch.bfloat16, torch.float16) or getattr(policy, "output_dtype", None) != torch.float32:
        return None
    from peft import PeftModel

    base = model.get_base_model() if isinstance(model, PeftModel) else model
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if head is None:
        return None

    def cast(module, args):
        weight = getattr(module, "weight", None)
        if weight is None or not args or not torch.is_tensor(args[0]) or not args[0].is_floating_point():
            return None
        if args[0].dtype == weight.dtype:
            return None
        return (args[0].to(weight.dtype), *args[1:])

    return head.register_forward_pre_hook(cast)


# ---------------------------------------------------------------------------------------- non-finite values ---
def _local(tensor):
    """The part of ``tensor`` this process holds: a DTensor's local shard (FSDP2), a ZeRO-3 parameter's partition."""
    if hasattr(tensor, "ds_tensor"):
        return tensor.ds_tensor
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _nonfinite(tensors) -> bool:
    """Whether the parts of ``tensors`` this process holds contain a non-finite value (one reduction, one sync)."""
    tensors = [t for t in (_local(t) for t in tensors) if t is not None and t.numel()]
    if not tensors:
        return False
    norms = torch._foreach_norm([t.detach() for t in tensors])
    return not bool(torch.isfinite(torch.stack([n.float() for n in norms]).sum()))


def _bad_count(tensors, accelerator) -> int:
    """How many processes hold a non-finite value in ``tensors`` (their local parts): one flag, summed."""
    bad = torch.tensor([float(_nonfinite(tensors))], device=accelerator.device)
    if accelerator.num_processes > 1:
        bad = accelerator.reduce(bad, "sum")
    return int(bad.item())


_WHAT_TO_DO = ("Look at the last logged rewards, advantages and grad_norm; resume from the last checkpoint with a lower "
               "max_grad_norm (and cast_lm_head_to_fp32: true), or start a new run from its weights "
               "(--model_name_or_path <output_dir>/checkpoint-N) with a lower learning_rate (a resume keeps the "
               "checkpoint's learning_rate); in bf16/fp16 keep fp32 weights (low_precision_weights: upcast, or "
               "DeepSpeed)")


class FiniteGuard(TrainerCallback):
    """Stops training at non-finite gradients (``on_pre_optimizer_step``: after clipping, before the optimizer's
    step) and non-finite weights (``on_optimizer_step``: after it, before the next rollout or checkpoint). Added by
    :class:`FiniteTrainingMixin`. With fp16 and a gradient scaler, non-finite gradients are the scaler's business
    (it skips that step), and under DeepSpeed the update has already run inside ``backward``: then only the weights
    are checked."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        trainer = self.trainer
        if trainer.is_deepspeed_enabled or trainer.accelerator.scaler is not None:
            return
        grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
        bad = _bad_count(grads, trainer.accelerator)
        if bad:
            raise FloatingPointError(
                f"{type(trainer).__name__}: non-finite gradients at optimizer step {state.global_step + 1} (on {bad} "
                "process(es)) although the loss was finite; training stops before the optimizer applies them "
                "(clipping would have turned every weight into NaN). " + _WHAT_TO_DO)

    def on_optimizer_step(self, args, state, control, **kwargs):
        trainer = self.trainer
        bad = _bad_count(list(trainer.model.parameters()), trainer.accelerator)
        if bad:
            raise FloatingPointError(
                f"{type(trainer).__name__}: the update of optimizer step {state.global_step + 1} made the weights "
                f"non-finite (on {bad} process(es)); training stops before anything is generated from them or saved. "
                + _WHAT_TO_DO)


class FiniteTrainingMixin:
    """Mix into a GRPOTrainer subclass, before GRPOTrainer: the master-weights rule (before the model loads), float32
    module outputs under FSDP mixed precision (:meth:`create_accelerator_and_postprocess`) and the non-finite guards
    of this module: the loss at every micro-step (:meth:`training_step`), the gradients and weights at every
    optimizer step (:class:`FiniteGuard`), the logits of every generation (:meth:`_generate_single_turn`); under
    FSDP2 with those float32 outputs, the LM head's input in its weights' dtype (:func:`head_input_in_its_dtype`)."""

    def __init__(self, model, reward_funcs=None, args=None, *rest, **kwargs):
        if args is not None:
            check_master_weights(model, args, type(self).__name__, kwargs.get("peft_config"))
            check_fsdp_lm_head_cast(model, args, type(self).__name__, kwargs.get("peft_config"))
        super().__init__(model, reward_funcs, args, *rest, **kwargs)
        self.add_callback(FiniteGuard(self))
        head_input_in_its_dtype(self.accelerator.unwrap_model(self.model), self.accelerator)

    def create_accelerator_and_postprocess(self):
        super().create_accelerator_and_postprocess()
        float32_outputs_under_fsdp(self.accelerator, type(self).__name__)  # before any model is prepared

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        bad = (~torch.isfinite(loss.detach())).float().reshape(1)
        if self.accelerator.num_processes > 1:
            bad = self.accelerator.reduce(bad, "sum")
        if bad.item() > 0:
            raise FloatingPointError(
                f"{type(self).__name__}: the loss is {loss.item()} at optimizer step {self.state.global_step + 1} "
                f"(on {int(bad.item())} process(es)); training stops before the update would make the weights "
                "non-finite. Look at the last logged rewards and advantages, lower learning_rate, or resume from the "
                "last checkpoint")
        return loss

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        with finite_logits(self), weights_kept_in_place(self):
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, images, multimodal_fields,
                                                                     num_generations, has_tool_images)
        if self.use_transformers_continuous_batching:
            # a request the engine failed (it logs the error) comes back empty or not at all: TRL would go on to an
            # IndexError or misaligned rows
            failed = sum(len(ids) == 0 for ids in completion_ids) + len(prompt_ids) - len(completion_ids)
            if failed:
                from .generation import CACHE_TOO_SMALL

                raise RuntimeError(
                    f"{type(self).__name__}: transformers' continuous batching failed {failed} of {len(prompt_ids)} "
                    "requests (empty or missing completions; the engine's error is logged above by "
                    f"ContinuousBatchingLogger). {CACHE_TOO_SMALL}")
        return completion_ids, logprobs


def _stand_ins(model, places: list) -> None:
    """Put a stand-in parameter in place of every plain floating-point parameter of ``model``: a new ``nn.Parameter``
    over the same data (no copy), one per original (tied weights share theirs). A cast of the model then changes the
    stand-ins only. Appends ``(module, name, original)`` to ``places`` as it goes, so that what was swapped can be
    put back even if this stops halfway. Parameter subclasses (quantized weights, e.g. bitsandbytes', whose
    attributes a plain stand-in would not carry) keep their place and meet TRL's cast as without this; they are
    frozen under PEFT, so no gradient hook of theirs is at stake."""
    stand_ins = {}
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False, remove_duplicate=False)):
            if type(p) is not torch.nn.Parameter or not p.is_floating_point():
                continue
            if id(p) not in stand_ins:
                stand_ins[id(p)] = torch.nn.Parameter(p.data, requires_grad=p.requires_grad)
            setattr(module, name, stand_ins[id(p)])
            places.append((module, name, p))


@contextmanager
def weights_kept_in_place(trainer):
    """The continuous-batching rollout, without losing the float32 weights, their gradient synchronisation or the run.
    TRL 1.16 casts the policy in place before ``generate_batch`` (``unwrapped_model.to(torch.bfloat16)`` when
    ``bf16``, then the head back to float32 with ``cast_lm_head_to_fp32``) and never back: the float32 weights the
    optimizer updates would be rounded to bf16 at every rollout, so updates below bf16's resolution vanish, as with
    no master copy at all. A cast of a parameter's ``.data`` to another dtype also drops its gradient accumulator,
    and with it the hooks DDP put there to all-reduce its gradient: every process would then train its own replica,
    silently. And under Accelerate's mixed precision (``bf16``/``fp16``, or ``mixed_precision`` from
    ``accelerate launch``) every request would fail (:func:`~trl_variants.generation.own_forward`). So for the
    rollout the model runs its own forward and holds stand-in parameters over the same data (:func:`_stand_ins`):
    TRL's cast casts those (generation in bf16/fp16, as TRL intends; float32 and bf16 copies of the weights are both
    held meanwhile), and afterwards the original parameters, never touched, are back in place, as are the buffers
    and the model's train/eval mode. (DeepSpeed holds the weights in its own way: left to TRL; FSDP with mixed
    precision is refused by the configs.)"""
    if not trainer.use_transformers_continuous_batching or trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
        yield
        return
    from .generation import own_forward

    model = trainer.accelerator.unwrap_model(trainer.model)
    buffers = [(module, name, buf) for module in model.modules() for name, buf in module.named_buffers(recurse=False)]
    was_training = model.training
    places = []
    try:
        _stand_ins(model, places)
        with own_forward(model):
            yield
    finally:
        for module, name, original in places:
            setattr(module, name, original)
        for module, name, buf in buffers:
            if getattr(module, name) is not buf:
                setattr(module, name, buf)
        model.train(was_training)


@contextmanager
def finite_logits(trainer):
    """While transformers generates (``generate`` or continuous batching) with ``trainer``'s policy, check the logits
    of every decoding step before anything is sampled from them: a non-finite logit raises ``FloatingPointError``
    naming the step and whether the weights are finite, instead of a device-side assert inside ``generate``. (vLLM
    samples in its own engine: nothing to check here.)"""
    head = trainer.accelerator.unwrap_model(trainer.model).get_output_embeddings()
    if head is None or trainer.use_vllm:
        yield
        return

    def check(module, inputs, output):
        logits = output if torch.is_tensor(output) else getattr(output, "logits", None)
        if logits is None or bool(torch.isfinite(logits).all()):
            return
        step = trainer.state.global_step + (1 if trainer.model.training else 0)
        weights = ("the weights are finite, so the activations overflowed in "
                   f"{logits.dtype}".replace("torch.", "")
                   if not _nonfinite(trainer.model.parameters()) else "the weights are not finite")
        raise FloatingPointError(
            f"{type(trainer).__name__}: non-finite logits while generating (optimizer step {step}; {weights}); "
            "stopped before sampling from them. " + _WHAT_TO_DO)

    handle = head.register_forward_hook(check)
    try:
        yield
    finally:
        handle.remove()
