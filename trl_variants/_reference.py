"""The frozen starting policy as a reference model, built from the weights a trainer was given.

GRPOTrainer builds its reference by reloading ``config._name_or_path``: right for a model passed by path, wrong for
an in-memory model that was edited after loading (or built from a config). Trainers that need a live reference for a
model object use :func:`frozen_copy_of_policy` instead.
"""

from __future__ import annotations

from trl.trainer.utils import add_fused_lm_head

from ._common import params_sharded


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
