"""The policy's weights as the trainers see them: PEFT or not, sharded (ZeRO-3 / FSDP) or not, gathered in full
for a pass before training, and the frozen starting policy as a reference model.

GRPOTrainer builds its reference by reloading ``config._name_or_path``: right for a model passed by path, wrong for
an in-memory model that was edited after loading (or built from a config). Trainers that need a live reference for a
model object use :func:`frozen_copy_of_policy` instead.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from trl.trainer.utils import add_fused_lm_head


def is_peft_model(model) -> bool:
    """Whether ``model`` (unwrapped: a trainer's ``accelerator.unwrap_model(trainer.model)``) is a PEFT model,
    adapters on a base model: its reference policy is then the base model, the adapters disabled."""
    from peft import PeftModel

    return isinstance(model, PeftModel)


def _zero3(trainer) -> bool:
    """Whether the trainer runs DeepSpeed ZeRO-3 (its parameters partitioned from the moment the model loads)."""
    if not getattr(trainer, "is_deepspeed_enabled", False):
        return False
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    return plugin is not None and plugin.zero_stage == 3


def reentrant_checkpointing_under_zero3(trainer) -> bool:
    """Whether the trainer runs DeepSpeed ZeRO-3 with reentrant gradient checkpointing (``gradient_checkpointing``
    with ``gradient_checkpointing_kwargs={"use_reentrant": True}``, which TRL forces for PEFT under ZeRO-3, or
    kwargs without ``use_reentrant``). There a second forward with gradient through the same weights before the
    step's one backward fails in that backward: each checkpointed segment runs its own backward, so ZeRO-3 sees a
    weight's gradient twice (DeepSpeed 0.19.8: ``AssertionError`` in ``__reduce_and_partition_ipg_grads``;
    docs/distributed.md)."""
    args, kwargs = trainer.args, trainer.args.gradient_checkpointing_kwargs
    # no kwargs: transformers checkpoints non-reentrant; kwargs without use_reentrant reach torch, whose default is
    # reentrant
    return bool(_zero3(trainer) and args.gradient_checkpointing and kwargs is not None
                and kwargs.get("use_reentrant", True) is not False)


def second_forward_refusal(trainer_name: str, what: str) -> str:
    """Why a forward with gradient of its own (``what``: a part, a loss term) is refused under
    :func:`reentrant_checkpointing_under_zero3`, and the fixes."""
    return (f"{trainer_name}: {what} runs a forward with gradient of its own before the step's one backward, and "
            "this run uses DeepSpeed ZeRO-3 with reentrant gradient checkpointing (TRL sets use_reentrant=True for "
            "PEFT under ZeRO-3). There DeepSpeed fails in the first backward (an AssertionError in ZeRO-3's gradient "
            "reduction: every checkpointed segment runs its own backward, so a weight's gradient arrives twice). "
            "Fix: gradient_checkpointing=False (--gradient_checkpointing false), or DeepSpeed ZeRO-2 "
            "(configs/accelerate/zero2.yaml), or, training the full model without PEFT, "
            "gradient_checkpointing_kwargs={'use_reentrant': False}")


def params_sharded(trainer) -> bool:
    """Whether the trainer's parameters are partitioned over processes once prepared (DeepSpeed ZeRO-3 or FSDP)."""
    return getattr(trainer, "is_fsdp_enabled", False) or _zero3(trainer)


def fsdp2_sharded(trainer) -> bool:
    """Whether the policy is sharded by FSDP2 (``fully_shard``: DTensor parameters, each process holding a shard)."""
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    return bool(getattr(trainer, "is_fsdp_enabled", False)) and plugin is not None and plugin.fsdp_version == 2


@contextmanager
def full_state_dict_for_final_save(trainer, final: bool = True):
    """Inside, FSDP's state dict type is ``FULL_STATE_DICT`` for a final save (``final``; a checkpoint's is left as it
    is). transformers' ``save_model`` writes the weights under FSDP only with ``FULL_STATE_DICT``; with
    ``SHARDED_STATE_DICT`` (FSDP2's default when the accelerate config names none) it wrote none, without a word, and
    the run went on to its model card and Hub push. Switching the plugin for the final save is accelerate's documented
    use of ``FullyShardedDataParallelPlugin.set_state_dict_type`` (train and checkpoint sharded, save the final model
    full); checkpoints keep the sharded form, which transformers saves and resumes with ``save_fsdp_model``."""
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if not final or not getattr(trainer, "is_fsdp_enabled", False) or plugin is None \
            or "FULL_STATE_DICT" in str(plugin.state_dict_type):
        yield
        return
    kept = plugin.state_dict_type
    plugin.set_state_dict_type("FULL_STATE_DICT")
    try:
        yield
    finally:
        plugin.set_state_dict_type(kept)


def drop_gathered_weights(trainer, model) -> None:
    """FSDP2: free the full weights a module still holds (the root module keeps them after a forward, for the
    backward it expects; ``unshard()`` keeps them until told), so that the next forward gathers the shards as they are
    now. No communication; nothing to do without FSDP2. Not between a forward and its backward.

    A unit of several modules whose forward did not run them all stays "in forward" in torch 2.11 until a backward
    ends it: Accelerate's unit of the final norm, the LM head and the tied embeddings after TRL's fused head (which
    never runs the head's forward), under ``no_grad``. Such a unit ignores ``reshard()`` and skips its next gather,
    so it kept serving the weights it held (EEPO's unlearned ones, to the training step after the restore: 2
    processes trained unlike 1). Its forward is completed first, as torch 2.13 does at the end of the root's forward
    (``_force_complete_incomplete_states``): torch's private state, in torch's own way."""
    if fsdp2_sharded(trainer):
        from torch.distributed.fsdp import FSDPModule

        for module in model.modules():
            if isinstance(module, FSDPModule):
                _complete_unfinished_forward(module._get_fsdp_state())
                module.reshard()


def _complete_unfinished_forward(state) -> None:
    """Finish the forward of an FSDP2 unit some of whose modules did not run (torch 2.11; in 2.13 none is left)."""
    pending = getattr(state, "_modules_to_run_forward", None)
    if not pending:
        return
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    for group in fsdp_param_groups(state):
        group.post_forward(None, None, None)
    state._training_state = TrainingState.IDLE
    pending.clear()


def check_whole_policy_for_generation(trainer, who: str) -> None:
    """Refuse, naming the fix, a sharded setup in which :func:`whole_policy_for_generation` cannot hold the full
    weights on every process: FSDP1 (FSDP2 can), FSDP2 on torch older than 2.8 (no ``set_reshard_after_forward``),
    and ZeRO-3 with ``ds3_gather_for_generation=False`` (the user chose not to hold them: the model may not fit on
    one device)."""
    if getattr(trainer, "is_fsdp_enabled", False) and not fsdp2_sharded(trainer):
        raise ValueError(f"{who} under FSDP1 cannot hold the full weights for its sampling on every process: use FSDP2 "
                         "(fsdp_version: 2, configs/accelerate/fsdp2.yaml), or evaluate the saved checkpoints with "
                         "`trl-variants evaluate`")
    if fsdp2_sharded(trainer):
        from torch.distributed.fsdp import FSDPModule

        if not hasattr(FSDPModule, "set_reshard_after_forward"):  # public since torch 2.8
            raise ValueError(f"{who} under FSDP2 needs torch >= 2.8 (FSDPModule.set_reshard_after_forward keeps the "
                             f"gathered weights through the sampling's forwards), and this is torch "
                             f"{torch.__version__}: upgrade torch, or evaluate the saved checkpoints with "
                             "`trl-variants evaluate` (--heldout_eval_steps 0 turns the evaluation during training off)")
    if _zero3(trainer) and not trainer.args.ds3_gather_for_generation:
        raise ValueError(f"{who} under DeepSpeed ZeRO-3 samples with the full weights gathered on every process, and "
                         "this run sets ds3_gather_for_generation=False (the model may not fit on one device): set it "
                         "True, or evaluate the saved checkpoints with `trl-variants evaluate`")


@contextmanager
def whole_policy_for_generation(trainer):
    """The trainer's policy (unwrapped) holding its full weights on every process for a while, so that each process
    can run its own number of forward calls (its own prompts, its own decoding lengths) without waiting for the
    others: under ZeRO-3 or FSDP every forward on sharded weights is a collective, and processes running different
    numbers of them would hang. Every process must enter and leave it together (entering gathers the weights).

    * ZeRO-3: TRL's ``unwrap_model_for_generation`` with the weights gathered (what GRPOTrainer samples with when
      ``ds3_gather_for_generation``, the default), DeepSpeed's hooks off inside.
    * FSDP2: every ``FSDPModule`` unsharded (``unshard()``) and kept so through its forwards
      (``set_reshard_after_forward(False)``, torch's documented switch for evaluation); on leaving, the full
      weights are freed (``reshard()``) and each module's resharding is put back as it was.
    * Otherwise (one process, DDP, ZeRO-1/2): the unwrapped model as it is.

    Read-only: nothing written to the weights inside is kept under ZeRO-3. Moving the model inside (``.to``) would
    reshard FSDP2's modules: leave it where it is. Refused setups: :func:`check_whole_policy_for_generation`."""
    check_whole_policy_for_generation(trainer, "sampling with the full weights")
    if _zero3(trainer):
        from trl.models import unwrap_model_for_generation

        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=True,
                                         gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs
                                         ) as model, _without_start_of_forward_hook(trainer.model_wrapped):
            yield model  # TRL puts DeepSpeed's hooks back only when this returns: an error here ends the run
        return
    model = trainer.accelerator.unwrap_model(trainer.model)
    if not fsdp2_sharded(trainer):
        yield model
        return
    from torch.distributed.fsdp import FSDPModule

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if isinstance(model, FSDPModule):  # the root settles its own resharding at its first forward, which may come
        model._get_fsdp_state()._lazy_init()  # inside: settled now (a no-op after it), so that what is saved is kept
    # each module's setting, saved to be put back exactly: torch has no public getter for it
    states = [m._get_fsdp_state() for m in modules]
    saved = [(s, s._auto_reshard_after_forward, [(g, g.post_forward_mesh_info) for g in fsdp_param_groups(s)])
             for s in states]
    try:
        for m in modules:
            m.set_reshard_after_forward(False, recurse=False)
        for m in modules:  # the same modules in the same order on every process: matching all-gathers
            m.unshard()
        yield model
    finally:
        drop_gathered_weights(trainer, model)
        for s, auto, groups in saved:
            s._auto_reshard_after_forward = auto
            for g, info in groups:
                g.post_forward_mesh_info = info


def whole_value(tensor):
    """``tensor`` as a plain tensor holding its whole value on every process: a DTensor (FSDP2's gradient norm) is
    gathered with ``full_tensor()``, a collective every process must join; anything else is returned as it is. Under
    torch 2.8 the gradient norm ``clip_grad_norm_`` returns for FSDP2's sharded gradients is a partial DTensor whose
    ``.item()`` (what transformers logs) is this process's share: 2 processes logged 0.66x one's (the clipping itself
    used the whole norm: the weights were the same). torch 2.10 and later return it replicated; nothing to gather.
    (A DTensor recognised by its method, as :func:`~trl_variants._numerics._local` does.)"""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def fsdp_param_groups(state) -> list:
    """The parameter groups of an FSDP2 module's state (torch's private state, read and put back as it was):
    ``_fsdp_param_groups`` since torch 2.13, one ``_fsdp_param_group`` (or None) in torch 2.11, which the GPU
    machines here run (the held-out evaluation under FSDP2 failed there on the plural)."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = getattr(state, "_fsdp_param_group", None)
    return [] if group is None else [group]


@contextmanager
def _without_start_of_forward_hook(engine):
    """DeepSpeed ZeRO-3's start-of-forward hook left out for a while. TRL's ``unwrap_model_for_generation`` removes
    ZeRO-3's parameter hooks but not this one, which DeepSpeed 0.19.8 registers on the top module: at a forward after
    the trace was reset (TRL resets it when it puts the hooks back) it checks the recorded module order against the
    other processes, a broadcast. A process that samples nothing (fewer chunks than processes) never joins it: a
    hang. The hook is put back where it was (first among the module's forward pre-hooks)."""
    optimizer = getattr(engine, "optimizer", None)
    offload = getattr(optimizer, "parameter_offload", None)
    handle = getattr(offload, "fwd_pre_hook", None)
    if handle is None:
        yield
        return
    hooks = offload.module._forward_pre_hooks
    saved = dict(hooks)
    hooks.pop(handle.id, None)
    try:
        yield
    finally:
        hooks.clear()
        hooks.update(saved)


def full_parameters(trainer, params=None):
    """Context in which ``trainer.model`` holds its full parameters on every process: under DeepSpeed ZeRO-3 they are
    partitioned from the moment the model is loaded, so the offline passes (run in ``__init__``, before the model is
    prepared) gather them with DeepSpeed's ``zero.GatheredParameters`` (read-only: no process writes them back).
    Every other setup already holds full parameters at that point; FSDP shards them only in ``prepare``.
    ``params``: gather only these (e.g. one at a time, to read a sample of each)."""
    from contextlib import nullcontext

    if not _zero3(trainer):
        return nullcontext()
    import deepspeed

    params = list(trainer.model.parameters()) if params is None else list(params)
    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


@contextmanager
def on_accelerator_device(trainer, model=None):
    """``model`` (default: the trainer's) on ``trainer.accelerator.device`` for an offline pass run in ``__init__``.
    Under DeepSpeed (ZeRO-1/2) and FSDP, transformers' Trainer leaves the model where it was loaded (the CPU) until
    ``prepare`` puts it on the GPU, while the passes give it tensors on the accelerator's device: the model goes
    there for the pass and back afterwards (before ``prepare`` nothing is hooked to its parameters). ZeRO-3's
    partitioned parameters, a model already there and one with no parameters are left as they are."""
    model = trainer.model if model is None else model
    first = next(iter(model.parameters()), None)
    target = torch.device(trainer.accelerator.device)
    if _zero3(trainer) or first is None or first.device == target or first.device.type == "meta":
        yield
        return
    where = first.device
    model.to(target)
    try:
        yield
    finally:
        model.to(where)


def frozen_copy_of_policy(trainer):
    """A frozen, evaluation-mode copy of ``trainer``'s current policy weights, with GRPO's fused LM head at the
    trainer's temperature, prepared by the accelerator. Call it in ``__init__``, before any update."""
    if params_sharded(trainer):
        raise ValueError("with ZeRO-3 / FSDP pass the model as a path: the reference is then loaded from it")
    policy = trainer.accelerator.unwrap_model(trainer.model)
    # A deepcopy would keep calling the ORIGINAL model's patched forward: rebuild from the config instead.
    ref = type(policy)(policy.config).to(device=policy.device, dtype=policy.dtype)
    ref.load_state_dict(policy.state_dict())
    ref.eval().requires_grad_(False)
    add_fused_lm_head(ref, temperature=trainer.temperature, cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32)
    return trainer.accelerator.prepare_model(ref, evaluation_mode=True)
