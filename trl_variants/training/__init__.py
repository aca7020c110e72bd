"""The training entry point: ``trl-variants train <method>`` and the example scripts ``examples/train_<method>.py``
(:func:`train_main`, which runs :func:`run_training`).

Modules: ``arguments`` (:class:`TrainScriptArguments`, the method's parser, :func:`parse_args`, held-out flags),
``model_options`` (the ``tiny`` shorthand, model loading and quantization options), ``batch`` (a recipe's batch on
this process count, :func:`recipe_batch`), ``preflight`` (what the run needs, checked before anything loads; where it
runs) and ``run`` (trainer arguments, train, save, push).

>>> from trl_variants.training import train_main
>>> train_main("erpo", argv=["--max_steps", "2"])  # = trl-variants train erpo --max_steps 2
"""

from .arguments import TrainScriptArguments, method_parser, parse_args
from .batch import recipe_batch
from .model_options import MODEL_SHORTHANDS, model_path
from .preflight import check_prerequisites, prerequisite_problems, where_it_runs
from .run import run_training, train_and_save, train_main, trainer_kwargs

__all__ = [
    "MODEL_SHORTHANDS",
    "TrainScriptArguments",
    "check_prerequisites",
    "method_parser",
    "model_path",
    "parse_args",
    "prerequisite_problems",
    "recipe_batch",
    "run_training",
    "train_and_save",
    "train_main",
    "trainer_kwargs",
    "where_it_runs",
]
