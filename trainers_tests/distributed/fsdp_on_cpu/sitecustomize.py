"""FSDP over gloo CPU processes for any command started by ``accelerate launch`` with an FSDP config, on a machine
without a GPU: put this folder first on ``PYTHONPATH`` (Python imports ``sitecustomize`` at start-up), e.g.

    PYTHONPATH=trainers_tests/distributed/fsdp_on_cpu accelerate launch --config_file configs/accelerate/fsdp2.yaml \\
        --num_processes 2 --mixed_precision no -m trl_variants train erpo --use_cpu false --ddp_backend gloo ...

It applies the distributed harness's ``_fsdp_on_cpu`` (Accelerate 1.15 turns FSDP on only over GPU process groups;
docs/distributed.md), and with ``HARNESS_GROUPED_HOOKS=first_only`` its ``_grouped_hooks_as_in_torch_2_11`` (FSDP2's
grouped units as torch 2.11 runs them). For testing only: it does nothing where FSDP was not asked for, and lifts
no gate where CUDA is available."""

import os
import sys
from pathlib import Path

if os.environ.get("ACCELERATE_USE_FSDP") == "true":  # (any other process starts without importing anything)
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from trainers_tests.distributed.harness import _fsdp_on_cpu

    _fsdp_on_cpu()  # nothing where CUDA is available
    if os.environ.get("HARNESS_GROUPED_HOOKS") == "first_only":  # FSDP2's grouped units as torch 2.11 runs them
        from trainers_tests.distributed.harness import _grouped_hooks_as_in_torch_2_11

        _grouped_hooks_as_in_torch_2_11()
