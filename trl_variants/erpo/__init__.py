from .config import ERPOConfig
from .trainer import ERPOTrainer

__all__ = ["ERPOConfig", "ERPOTrainer"]
