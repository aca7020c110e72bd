"""Before anything loads: what the run needs and this machine lacks (extras, tracker login, Hub id and token, the
checkpoint to resume), listed in one message with each fix; and the one line saying where the run trains."""

from __future__ import annotations

import os

from ..recipe_catalog import hub_push_problems

TRACKER_PACKAGES = {"wandb": '"trl-variants[wandb]"', "trackio": '"trl-variants[trackio]"', "comet_ml": "comet-ml",
                    "azure_ml": "azureml-core", "neptune": "neptune", "tensorboard": "tensorboard"}
"""What to ``pip install`` for a ``report_to`` tracker (others: the tracker's name)."""


def _wandb_logged_in() -> bool:
    """A wandb API key is at hand: ``WANDB_API_KEY``, or the netrc entry ``wandb login`` writes for the API host."""
    import netrc
    from urllib.parse import urlparse

    if os.environ.get("WANDB_API_KEY", "").strip():
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return bool(os.path.isfile(path) and netrc.netrc(path).authenticators(host))
    except (OSError, netrc.NetrcParseError):
        return False


def _uses_deepspeed(training_args) -> bool:
    """The launch asks for DeepSpeed: ``accelerate launch`` with a DeepSpeed config sets ``ACCELERATE_USE_DEEPSPEED``
    (accelerate's state reads it), or the training arguments name a DeepSpeed config."""
    from accelerate.utils import parse_flag_from_env

    return parse_flag_from_env("ACCELERATE_USE_DEEPSPEED") or bool(getattr(training_args, "deepspeed", None))


def prerequisite_problems(training_args) -> list[str]:
    """What the run needs and this machine lacks, each with its fix: an extra for ``use_vllm``, a DeepSpeed launch
    and each ``report_to`` tracker; the wandb login (unless ``WANDB_MODE`` is offline or disabled); for
    ``push_to_hub`` a real ``hub_model_id`` (not a placeholder like ``your-org/...``), a Hub token and the network;
    for ``resume_from_checkpoint`` true / last a checkpoint in output_dir; a ``presample_cache_dir`` that is a file
    (DPH-RL, A*-PO, the composed trainer's offline pass). Reads the environment only: nothing is
    imported that the run would not import, nothing loads."""
    import importlib.util

    from .._checkpoint import last_complete_checkpoint, resume_target

    problems = []
    if getattr(training_args, "use_vllm", False) and importlib.util.find_spec("vllm") is None:
        problems.append('use_vllm: true needs vLLM: pip install "trl-variants[vllm]" (on a CUDA GPU), or pass '
                        "--use_vllm false to generate with transformers")
    if _uses_deepspeed(training_args) and importlib.util.find_spec("deepspeed") is None:
        problems.append('the launch uses DeepSpeed (an accelerate config with distributed_type: DEEPSPEED, e.g. '
                        'accelerate/zero2.yaml) but deepspeed is not installed: pip install "trl-variants[deepspeed]", '
                        "or launch with another accelerate config (accelerate/multi_gpu.yaml, or none on one GPU)")
    trackers = [t for t in (training_args.report_to or []) if t not in ("none", "all")]
    if trackers:
        from transformers.integrations.integration_utils import get_available_reporting_integrations

        available = set(get_available_reporting_integrations())
        for tracker in trackers:
            if tracker not in available:
                problems.append(f"report_to: [{tracker}] needs {tracker}: pip install "
                                f"{TRACKER_PACKAGES.get(tracker, tracker)}, or pass --report_to none (or another "
                                "tracker, e.g. --report_to trackio)")
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if "wandb" in trackers and mode not in ("offline", "disabled", "dryrun") and not _wandb_logged_in():
        problems.append("report_to: [wandb] needs a wandb login: run `wandb login` (or set WANDB_API_KEY), or "
                        "WANDB_MODE=offline to log locally for a later `wandb sync`, or pass --report_to none")
    if training_args.push_to_hub:
        problems += hub_push_problems(training_args.hub_model_id, "hub_model_id")
    cache = getattr(training_args, "presample_cache_dir", None)
    if cache and os.path.exists(cache) and not os.path.isdir(cache):
        problems.append(f"presample_cache_dir: {cache} is a file, not a directory (the offline pass caches its results "
                        "in a directory there): pass --presample_cache_dir DIR (created when missing), or move the "
                        "file away")
    if resume_target(training_args.resume_from_checkpoint) is True:
        try:
            last_complete_checkpoint(training_args.output_dir)
        except ValueError as e:
            problems.append(str(e))
    return problems


def check_prerequisites(training_args) -> None:
    """Refuse, in one message listing every :func:`prerequisite_problems` item with its fix, a run that would fail
    later (transformers creates the Hub repository and starts the trackers only after the model has loaded)."""
    problems = prerequisite_problems(training_args)
    if problems:
        raise ValueError(f"this run cannot start here ({len(problems)} problem{'s' if len(problems) > 1 else ''}, "
                         "checked before any data or model loads):\n" + "\n".join(f"  - {p}" for p in problems)
                         + "\nA first run without extras, logins or the Hub: --push_to_hub false --report_to none "
                         "--use_vllm false (each paper recipe's header has a `# smoke:` command)")


def where_it_runs(training_args) -> str:
    """One line: the device and process count this run trains on, DeepSpeed's ZeRO stage or FSDP, the precision,
    and, when a recipe keeps a run on the CPU (the tiny recipes' ``use_cpu: true``) on a machine with a GPU, the flag
    that moves it there."""
    import torch

    device = training_args.device
    name = (f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device))
    from .._numerics import mixed_precision, uses_fsdp

    precision = mixed_precision(training_args) or "fp32"
    plugin = getattr(training_args, "deepspeed_plugin", None)  # set by transformers under DeepSpeed
    engine = (f"DeepSpeed ZeRO-{plugin.zero_stage}, " if plugin is not None
              else "FSDP, " if uses_fsdp(training_args) else "")
    line = (f"training on {name}, {training_args.world_size} process{'es' if training_args.world_size > 1 else ''}, "
            f"{engine}{precision} compute")
    if training_args.use_cpu and torch.cuda.is_available():
        line += (f" (use_cpu: true; this machine has {torch.cuda.device_count()} GPU(s): --use_cpu false trains "
                 "there, see docs/gpu.md)")
    return line

