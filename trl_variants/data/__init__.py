"""Data loading for the commands and the example scripts: the data options (:class:`DataScriptArguments`), datasets
and mixtures (:mod:`.loading`), prompt formats (:mod:`.prompts`) and reward-function resolution
(:mod:`.reward_resolution`).

>>> from trl_variants.data import DataScriptArguments, load_datasets, load_reward_funcs
>>> train, _ = load_datasets(DataScriptArguments(embedded_train_size=100))

Light to import (no torch, no ``datasets``: each loader imports what it needs when called), so the command line's
``--help`` stays fast.
"""

from .arguments import EMBEDDED, DataScriptArguments
from .loading import (
    check_dataset_flags,
    load_datasets,
    load_default_dataset,
    load_eval_dataset,
    uses_embedded,
)
from .prompts import filter_prompt_length, prepare_columns, prompt_lengths, template_prompts
from .reward_resolution import TRL_REWARD_FUNCS, get_reward_funcs, load_reward_funcs, load_reward_model

__all__ = [
    "EMBEDDED",
    "TRL_REWARD_FUNCS",
    "DataScriptArguments",
    "check_dataset_flags",
    "filter_prompt_length",
    "get_reward_funcs",
    "load_datasets",
    "load_default_dataset",
    "load_eval_dataset",
    "load_reward_funcs",
    "load_reward_model",
    "prepare_columns",
    "prompt_lengths",
    "template_prompts",
    "uses_embedded",
]
