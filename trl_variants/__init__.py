"""trl_variants: TRL GRPOTrainer subclasses for recent RL-for-reasoning algorithms.

>>> from trl_variants import ERPOConfig, ERPOTrainer, DEFAULT_MODEL_PATH, load_default_dataset

The names below are imported on first use (PEP 562), so ``trl-variants --help`` and the other light commands run
without importing torch, TRL's trainers or peft.
"""

import importlib
import importlib.util

__version__ = "0.1.0"

_LAZY = {
    "APOConfig": ".apo", "APOTrainer": ".apo",
    "ComposedConfig": ".composed", "ComposedTrainer": ".composed",
    "DEFAULT_MODEL_PATH": ".default", "default_model_path": ".default", "load_default_dataset": ".default",
    "DPHConfig": ".dph", "DPHTrainer": ".dph",
    "EEPOConfig": ".eepo", "EEPOTrainer": ".eepo",
    "ERPOConfig": ".erpo", "ERPOTrainer": ".erpo",
    "LossTerm": ".parts", "Part": ".parts", "PartsTrainer": ".parts", "PolicyForward": ".parts",
    "register_part": ".parts",
    "accuracy_reward": ".rewards", "format_reward": ".rewards",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name not in _LAZY:  # a submodule (trl_variants.apo) as the eager imports left it: imported on first use
        if importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return importlib.import_module(f".{name}", __name__)
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_LAZY])
