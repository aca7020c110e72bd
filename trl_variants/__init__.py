"""trl_variants: TRL GRPOTrainer subclasses for recent RL-for-reasoning algorithms.

>>> from trl_variants import ERPOConfig, ERPOTrainer, DEFAULT_MODEL_PATH, load_default_dataset
"""

__version__ = "0.1.0"

from .apo import APOConfig, APOTrainer
from .composed import ComposedConfig, ComposedTrainer
from .default import DEFAULT_MODEL_PATH, default_model_path, load_default_dataset
from .dph import DPHConfig, DPHTrainer
from .eepo import EEPOConfig, EEPOTrainer
from .erpo import ERPOConfig, ERPOTrainer
from .rewards import accuracy_reward, format_reward

__all__ = [
    "APOConfig",
    "APOTrainer",
    "ComposedConfig",
    "ComposedTrainer",
    "DPHConfig",
    "DPHTrainer",
    "DEFAULT_MODEL_PATH",
    "EEPOConfig",
    "EEPOTrainer",
    "ERPOConfig",
    "ERPOTrainer",
    "accuracy_reward",
    "default_model_path",
    "format_reward",
    "load_default_dataset",
]
