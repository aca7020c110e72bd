from .config import APOConfig
from .trainer import APOTrainer

__all__ = ["APOConfig", "APOTrainer"]
