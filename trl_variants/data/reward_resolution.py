"""Reward-function resolution: ``--reward_funcs`` names (this package's, TRL's, or a dotted import path) and
``--reward_model_name_or_path`` turned into the callables a trainer, the offline pass and ``evaluate`` call."""

from __future__ import annotations

import importlib
import os
import sys

from .._validation import check_model_reference, ensure_pad_token
from ..rewards import REWARD_FUNCS

TRL_REWARD_FUNCS = ("reasoning_accuracy_reward", "think_format_reward", "get_soft_overlong_punishment")
"""Registry names of TRL's ``grpo.py`` that resolve to ``trl.rewards`` (``accuracy_reward`` is this package's)."""


def get_reward_funcs(names: list[str], allow_empty: bool = False):
    """Reward callables by registry name (``accuracy_reward``, ``format_reward``, TRL's :data:`TRL_REWARD_FUNCS`)
    or dotted import path. ``allow_empty``: no names is fine (a reward model scores instead)."""
    if not names and not allow_empty:
        raise ValueError("reward_funcs is empty: give at least one, e.g. --reward_funcs accuracy_reward, or a reward "
                         "model with --reward_model_name_or_path")
    funcs = []
    for name in names:
        if name in REWARD_FUNCS:
            funcs.append(REWARD_FUNCS[name])
        elif name in TRL_REWARD_FUNCS:
            import trl.rewards

            func = getattr(trl.rewards, name)
            # the values TRL's grpo.py registers it with
            funcs.append(func(max_completion_len=1280, soft_punish_cache=256)
                         if name == "get_soft_overlong_punishment" else func)
        elif "." in name:
            module, attr = name.rsplit(".", 1)
            sys.path.insert(0, os.getcwd())
            funcs.append(getattr(importlib.import_module(module), attr))
        else:
            raise ValueError(f"unknown reward function {name!r}: use one of "
                             f"{sorted(REWARD_FUNCS) + list(TRL_REWARD_FUNCS)} or 'pkg.module.func'")
    return funcs


def load_reward_model(path: str, chat_template_kwargs: dict | None = None, device=None):
    """A reward model as the offline pass and ``trl-variants presample`` / ``evaluate`` call it: loaded as
    GRPOTrainer loads ``reward_funcs=[path]`` (``AutoModelForSequenceClassification``, ``num_labels=1``, its own
    tokenizer, EOS as pad token when it has none) and wrapped in :class:`~trl_variants.presample.reward_calls.
    RewardModelReward`, which scores as GRPOTrainer does."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from ..presample.reward_calls import RewardModelReward

    check_model_reference(path, "--reward_model_name_or_path")
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1).eval()
    tokenizer = ensure_pad_token(AutoTokenizer.from_pretrained(path))
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id  # it scores the last non-pad token
    return RewardModelReward(model.to(device) if device is not None else model, tokenizer, chat_template_kwargs)


def load_reward_funcs(script_args, device=None, chat_template_kwargs: dict | None = None):
    """The reward model (first, as in TRL's grpo.py) and reward functions of the script arguments (a
    :class:`~trl_variants.data.DataScriptArguments`), all as callables (for ``trl-variants presample`` /
    ``evaluate``; a trainer loads the model itself from its path)."""
    funcs = []
    if script_args.reward_model_name_or_path:
        funcs.append(load_reward_model(script_args.reward_model_name_or_path, chat_template_kwargs, device))
    return funcs + get_reward_funcs(script_args.reward_funcs, allow_empty=bool(funcs))

