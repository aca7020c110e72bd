"""Which sharded setups EEPO's two-stage rollout takes (docs/distributed.md): FSDP2 yes (each process steps its own
shards; trained as one process in distributed/test_equivalence.py), ZeRO-3 and FSDP1 no, and under FSDP2 only with
rollouts that start gradient-accumulation cycles. Refused in the part's setup, with the fix named."""

from types import SimpleNamespace

import pytest

from trl_variants import EEPOConfig
from trl_variants.eepo.part import TwoStageRollout


def _trainer(tmp_path, zero_stage=None, fsdp_version=None, **config):
    args = EEPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **config)
    state = SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=zero_stage) if zero_stage else None,
                            fsdp_plugin=SimpleNamespace(fsdp_version=fsdp_version) if fsdp_version else None)
    return SimpleNamespace(args=args, accelerator=SimpleNamespace(state=state), is_deepspeed_enabled=bool(zero_stage),
                           is_fsdp_enabled=bool(fsdp_version))


def test_zero3_and_fsdp1_are_refused_naming_what_is_supported(tmp_path):
    for setup in (dict(zero_stage=3), dict(fsdp_version=1)):
        with pytest.raises(ValueError, match=r"supports DDP, ZeRO-1/2, FSDP2 and PEFT, not ZeRO-3 or FSDP1.*"
                                             r"entropy_gate='never'"):
            TwoStageRollout().setup(_trainer(tmp_path, **setup))


def test_fsdp2_refuses_rollouts_inside_accumulation_cycles(tmp_path):
    trainer = _trainer(tmp_path, fsdp_version=2, per_device_train_batch_size=8, gradient_accumulation_steps=4,
                       steps_per_generation=2)
    with pytest.raises(ValueError, match=r"steps_per_generation x num_iterations = 2 micro-steps falls inside cycles "
                                         r"of gradient_accumulation_steps = 4.*a multiple of"):
        TwoStageRollout().setup(trainer)
    for ok in (dict(steps_per_generation=4), dict(steps_per_generation=2, num_iterations=2)):
        trainer = _trainer(tmp_path, fsdp_version=2, per_device_train_batch_size=8, gradient_accumulation_steps=4,
                           capture_stage2_logps=False, **ok)  # (its own choice: setup needs no model to make it)
        part = TwoStageRollout()
        part.setup(trainer)  # taken
        assert part.capture is False
