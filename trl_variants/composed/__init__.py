from .config import PART_NAMES, ComposedConfig
from .trainer import ComposedTrainer

__all__ = ["PART_NAMES", "ComposedConfig", "ComposedTrainer"]
