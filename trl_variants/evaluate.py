"""The evaluation API under its earlier name: ``trl_variants.evaluate.evaluate(...)``, ``write_report(...)``,
``EvalConfig``, ``PassAtKCallback`` and the rest of :mod:`trl_variants.evaluation` (where the code lives: metrics,
sampling, resume, report, callbacks).

>>> from trl_variants.evaluate import EvalConfig, evaluate, write_report
"""

from .evaluation import *  # noqa: F403
from .evaluation import __all__  # noqa: F401
