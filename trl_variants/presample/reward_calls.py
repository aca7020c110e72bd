"""Calling TRL-signature reward functions outside a trainer: weighted scoring, reward models as functions, and the
fingerprint that keys cached rewards. The checks of reward functions and their columns (and the checked wrapper the
trainers use) are :mod:`trl_variants._validation`'s."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import re
import sys
from importlib import metadata

import torch

from .._validation import CheckedReward, check_reward_columns, reward_name, reward_values

__all__ = ["RewardModelReward", "check_reward_columns", "reward_fingerprint", "reward_name", "score_completions",
           "wrap_reward_models"]


class RewardModelReward:
    """A sequence-classification reward model (and its tokenizer) as a TRL-signature reward function, for the offline
    pass and ``trl-variants presample`` / ``evaluate``. It scores as ``GRPOTrainer._calculate_rewards`` scores a
    reward model: prompt + completion (a conversation rendered with the reward tokenizer's chat template and
    ``chat_template_kwargs``), right padding, no special tokens added, the first logit. Named as TRL names a reward
    model (the last part of its model id). Its weights are not fingerprinted: the pass re-scores cached samples."""

    def __init__(self, model: torch.nn.Module, tokenizer, chat_template_kwargs: dict | None = None):
        from trl.trainer.utils import get_config_model_id

        self.model, self.tokenizer, self.chat_template_kwargs = model, tokenizer, dict(chat_template_kwargs or {})
        self.__name__ = get_config_model_id(model.config).split("/")[-1]

    def __call__(self, prompts, completions, **kwargs) -> list[float]:
        from trl.data_utils import apply_chat_template, is_conversational

        if is_conversational({"prompt": prompts[0]}):
            texts = [apply_chat_template({"messages": p + c}, self.tokenizer, **self.chat_template_kwargs)["text"]
                     for p, c in zip(prompts, completions, strict=True)]
        else:
            texts = [p + c for p, c in zip(prompts, completions, strict=True)]
        inputs = self.tokenizer(text=texts, return_tensors="pt", padding=True, padding_side="right",
                                add_special_tokens=False)
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            return self.model(**inputs.to(device)).logits[:, 0].float().tolist()


def wrap_reward_models(reward_funcs, processing_classes, chat_template_kwargs: dict | None = None) -> list:
    """``reward_funcs`` with every reward model (an ``nn.Module``, as GRPOTrainer holds it) wrapped in
    :class:`RewardModelReward` with its processing class, so the offline pass can call all of them alike."""
    return [RewardModelReward(f, p, chat_template_kwargs) if isinstance(f, torch.nn.Module) else f
            for f, p in zip(reward_funcs, processing_classes, strict=True)]


def _awaited(values):
    """The result of an async reward function's coroutine, run to completion on an event loop of its own (in a
    worker thread, so that a caller already inside a running loop, e.g. a notebook, is not disturbed)."""
    if not inspect.isawaitable(values):
        return values
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    async def wait():
        return await values

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wait()).result()


def score_completions(reward_funcs, reward_weights, prompts, completions, completion_ids, columns,
                      trainer_state=None):
    """Call the reward functions as GRPOTrainer does (``prompts``, ``completions``, ``completion_ids``, every
    dataset column as a keyword list, ``trainer_state`` (a trainer's ``state``; None outside a trainer), no-op
    ``log_extra`` / ``log_metric``); an async function is awaited.

    Returns ``(total, per_func)``: ``per_func[i][j]`` is function ``j``'s value for completion ``i`` (NaN for None),
    ``total[i]`` the weighted sum over the functions that gave a value (TRL's ``nansum``), NaN when none did: such a
    completion has no reward and is left out downstream (TRL warns about the same rows; so does the pass)."""
    per_func = [[math.nan] * len(reward_funcs) for _ in completions]
    for j, func in enumerate(reward_funcs):
        values = _awaited(func(prompts=prompts, completions=completions, completion_ids=completion_ids,
                               trainer_state=trainer_state, log_extra=lambda *a, **k: None,
                               log_metric=lambda *a, **k: None, **columns))
        for i, v in enumerate(reward_values(values, func, len(completions))):  # the trainers' check (NaN: None)
            per_func[i][j] = v
    total = []
    for row in per_func:
        given = [w * v for w, v in zip(reward_weights, row, strict=True) if not math.isnan(v)]
        total.append(math.fsum(given) if given else math.nan)
    return total, per_func


# Packages whose code decides what a reward function returns for the same text (the math reward's parser and
# verifier); their versions are part of a reward function's fingerprint.
_SCORING_PACKAGES = ("math-verify", "latex2sympy2_extended", "sympy", "trl-variants")


def _code_bytes(code) -> bytes:
    """The parts of a code object that say what it does: its bytecode (``co_code`` is the un-specialised form, the
    same before and after the interpreter has run it; ``marshal.dumps`` is not), constants (nested functions
    recursively), names and argument layout."""
    consts = b"|".join(_code_bytes(c) if inspect.iscode(c) else repr(c).encode() for c in code.co_consts)
    return b"".join([code.co_code, consts, repr((code.co_names, code.co_varnames, code.co_argcount,
                                                 code.co_kwonlyargcount)).encode()])


def _names_read(code) -> set[str]:
    """The global (and attribute) names a code object and the functions nested in it read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _names_read(const)
    return names


def _plain_data(obj) -> str | None:
    """A module-level container as JSON (keys sorted, sets as sorted lists, tuples as lists), or None where it holds
    other things (a function, an object: their reprs hold addresses)."""
    def as_list(value):
        if isinstance(value, set | frozenset):
            return sorted(value, key=repr)
        raise TypeError(type(value).__name__)

    try:
        return json.dumps(obj, sort_keys=True, default=as_list)
    except (TypeError, ValueError):
        return None


def _code_digest(namespace: dict) -> str | None:
    """A hash of the code that runs, not of the file on disk (which may have been edited since the import): the
    compiled code of every function and method the module namespace defines, their defaults, and the module-level
    data that code reads, as it is now: constants, compiled patterns, and containers (a settings dict edited between
    two runs is another key; one the code does not read, such as a start time, changes nothing). None where the code
    reads a module-level container that is not plain data: its values cannot be keyed."""
    h = hashlib.sha256()
    module_name, read = namespace.get("__name__"), set()
    for name, obj in sorted(namespace.items()):
        if inspect.isfunction(obj) and obj.__module__ == module_name:
            h.update(name.encode() + _code_bytes(obj.__code__) + repr(obj.__defaults__).encode())
            read |= _names_read(obj.__code__)
        elif inspect.isclass(obj) and obj.__module__ == module_name:
            for attr, member in sorted(vars(obj).items()):
                if inspect.isfunction(member):
                    h.update(f"{name}.{attr}".encode() + _code_bytes(member.__code__))
                    read |= _names_read(member.__code__)
    for name in sorted(read & namespace.keys()):
        obj = namespace[name]
        if isinstance(obj, int | float | str | bool | bytes | type(None)):
            h.update(f"{name}={obj!r}".encode())
        elif isinstance(obj, re.Pattern):  # its repr is cut at 200 characters
            h.update(f"{name}={obj.pattern!r}/{obj.flags}".encode())
        elif isinstance(obj, dict | list | tuple | set | frozenset):  # as JSON: a set's repr follows the hash seed
            data = _plain_data(obj)
            if data is None:
                return None
            h.update(f"{name}={data}".encode())
    return h.hexdigest()


def reward_fingerprint(func) -> str | None:
    """A hash of everything that decides a reward function's values: the compiled code of the module defining it
    (its helpers included) and the module-level data that code reads, its qualified name, its plain-data state, and
    the versions of Python and of the scoring packages. ``None`` when it cannot be fingerprinted (a lambda or
    closure, a model, state or module-level containers that are not plain data): the pass then re-scores the cached
    completions on every call instead of trusting them."""
    if isinstance(func, CheckedReward):  # a trainer's checked wrapper: the function it calls decides the values
        return reward_fingerprint(func.__wrapped__)
    if isinstance(func, torch.nn.Module):
        return None
    if isinstance(func, functools.partial):
        inner = reward_fingerprint(func.func)
        try:
            bound = json.dumps([func.args, func.keywords], sort_keys=True)
        except TypeError:
            return None
        return None if inner is None else hashlib.sha256((inner + bound).encode()).hexdigest()[:16]
    target = func if inspect.isfunction(func) or inspect.ismethod(func) else type(func)
    qualname = getattr(target, "__qualname__", "")
    # the namespace the code actually runs in (a re-imported module of the same name is another namespace)
    function = getattr(target, "__func__", target)
    namespace = getattr(function, "__globals__", None) or vars(inspect.getmodule(target) or object)
    if not qualname or "<lambda>" in qualname or "<locals>" in qualname or "__name__" not in namespace:
        return None
    try:
        state = json.dumps(vars(func) if target is type(func) else {}, sort_keys=True)
    except TypeError:
        return None
    versions = {"python": sys.version}
    for pkg in _SCORING_PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    code = _code_digest(namespace)
    if code is None:
        return None
    payload = json.dumps([namespace["__name__"], qualname, code, state, versions], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
