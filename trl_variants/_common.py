"""Small helpers shared by the four trainers' ``__init__``."""

from __future__ import annotations


def resolve_config(model, args, config_cls, suffix: str):
    """``args`` checked to be a ``config_cls``; when None, a default one named ``<model name>-<suffix>`` (as TRL does
    for GRPOTrainer)."""
    if args is None:
        name = model if isinstance(model, str) else model.config._name_or_path
        return config_cls(f"{str(name).rstrip('/').split('/')[-1]}-{suffix}")
    if not isinstance(args, config_cls):
        raise TypeError(f"args must be a {config_cls.__name__}, got {type(args).__name__}: build one with "
                        f"{config_cls.__name__}(...)")
    return args
