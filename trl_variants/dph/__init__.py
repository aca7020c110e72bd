from .config import DPHConfig
from .trainer import DPHTrainer

__all__ = ["DPHConfig", "DPHTrainer"]
