"""The model a run trains and how it loads: the ``tiny`` / ``default`` shorthands, ``ModelConfig``'s dtype /
attention / revision options, the ModelConfig flags that only act with another one, and quantization."""

from __future__ import annotations

from trl import ModelConfig

MODEL_SHORTHANDS = ("tiny", "default")
"""``--model_name_or_path`` (train) and ``--models`` / ``--base_model`` / ``--reference_model`` (evaluate) values naming
the shipped tiny model (when no local path of that name exists)."""


def model_path(value: str | None) -> str | None:
    """A model option's value with the shorthands resolved: ``tiny`` / ``default`` name the shipped tiny model
    (:data:`~trl_variants.default.DEFAULT_MODEL_PATH`) unless a local path of that name exists."""
    from pathlib import Path

    from ..default import DEFAULT_MODEL_PATH

    if value in MODEL_SHORTHANDS and not Path(value).exists():
        return DEFAULT_MODEL_PATH
    return value


def model_name_or_path(model_args: ModelConfig) -> str:
    """The model to train: ``--model_name_or_path`` (``tiny`` / ``default``: the shipped tiny model, see
    :func:`model_path`), or the shipped tiny default."""
    from ..default import DEFAULT_MODEL_PATH

    return model_path(model_args.model_name_or_path) or DEFAULT_MODEL_PATH


def model_init_kwargs(model_args: ModelConfig, training_args) -> dict:
    """``training_args.model_init_kwargs`` merged with ModelConfig's dtype / attention / revision options (GRPOTrainer
    adds ``trust_remote_code`` from the training arguments, as TRL's grpo.py does)."""
    kwargs = {"revision": model_args.model_revision, "attn_implementation": model_args.attn_implementation}
    if model_args.dtype is not None:
        kwargs["dtype"] = model_args.dtype
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    kwargs.update(training_args.model_init_kwargs or {})
    return kwargs


# ModelConfig options that only act together with another flag: TRL's scripts ignore them without it; we refuse.
_NEEDS_FLAG = {
    "use_peft": ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_target_parameters",
                 "lora_modules_to_save", "lora_task_type", "use_rslora", "use_dora", "load_in_4bit", "load_in_8bit"),
    "load_in_4bit": ("bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage"),
}


def check_model_flags(model_args: ModelConfig) -> None:
    """Refuse ModelConfig flags that would be ignored (an option set without the flag that enables it), naming the
    flag and the fix."""
    defaults = ModelConfig()  # (both --load_in_4bit and --load_in_8bit: ModelConfig itself refuses them)
    for switch, options in _NEEDS_FLAG.items():
        if getattr(model_args, switch):
            continue
        for option in options:
            if getattr(model_args, option) != getattr(defaults, option):
                why = (" (a quantized model cannot be trained directly: QLoRA trains LoRA adapters on it)"
                       if option.startswith("load_in") else "")
                raise ValueError(f"--{option} only acts with --{switch}, which is not set{why}: add --{switch} or "
                                 f"drop --{option}")


def quantization_config(model_args: ModelConfig):
    """The ``BitsAndBytesConfig`` of ``--load_in_4bit`` / ``--load_in_8bit`` built by TRL's own
    ``get_quantization_config`` (None without them). Checked here with transformers' own quantizer check (the one
    ``from_pretrained`` runs), so a machine where bitsandbytes cannot run fails now, naming the flag, not after the
    data has loaded, and never trains unquantized."""
    from transformers.quantizers import AutoHfQuantizer
    from trl import get_quantization_config

    config = get_quantization_config(model_args)
    if config is None:
        return None
    flag = "--load_in_4bit" if model_args.load_in_4bit else "--load_in_8bit"
    try:
        AutoHfQuantizer.from_config(config).validate_environment(device_map=None)
    except (ImportError, RuntimeError) as e:
        raise ValueError(f"{flag} quantizes the model with bitsandbytes, which cannot run here ({e}). Fix: run on a "
                         "machine where it can (a CUDA GPU, with `pip install bitsandbytes`), or drop "
                         f"{flag} to train the unquantized model (with --use_peft: plain LoRA). Nothing was "
                         "loaded") from e
    return config

