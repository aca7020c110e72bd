from .config import EEPOConfig
from .trainer import EEPOTrainer

__all__ = ["EEPOConfig", "EEPOTrainer"]
