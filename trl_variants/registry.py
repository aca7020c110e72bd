"""The methods of this package by short name: each one's trainer and config class (imported on first use, so reading
the registry loads neither TRL nor torch) and its label in tables and plots.

>>> from trl_variants.registry import method_classes
>>> trainer_cls, config_cls = method_classes("erpo")  # ERPOTrainer, ERPOConfig
"""

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    """One method: ``module.trainer`` / ``module.config`` are its classes, ``label`` its name in tables."""

    name: str
    module: str
    trainer: str
    config: str
    label: str

    def classes(self):
        """``(trainer_cls, config_cls)``, importing ``module``."""
        module = importlib.import_module(self.module)
        return getattr(module, self.trainer), getattr(module, self.config)


REGISTRY = {m.name: m for m in (
    Method("erpo", "trl_variants", "ERPOTrainer", "ERPOConfig", "ERPO"),
    Method("eepo", "trl_variants", "EEPOTrainer", "EEPOConfig", "EEPO"),
    Method("dph", "trl_variants", "DPHTrainer", "DPHConfig", "DPH-RL"),
    Method("apo", "trl_variants", "APOTrainer", "APOConfig", "A*-PO"),
    Method("composed", "trl_variants", "ComposedTrainer", "ComposedConfig", "Composed"),  # any subset of the parts
    Method("grpo", "trl", "GRPOTrainer", "GRPOConfig", "GRPO (TRL)"),  # TRL's own trainer: the baseline
)}
"""Every method, in the order ``trl-variants train`` lists them."""

PAPER_METHODS = ("erpo", "eepo", "dph", "apo")
"""The four papers' methods (one trainer each; not the composed one, not the GRPO baseline)."""


def method_classes(name: str):
    """``(trainer_cls, config_cls)`` of the method ``name`` of :data:`REGISTRY`."""
    if name not in REGISTRY:
        raise ValueError(f"unknown method {name!r}: choose one of {', '.join(REGISTRY)}")
    return REGISTRY[name].classes()
