"""Input checks that fire before any model loads ("nothing silent, nothing lost, nothing hangs").

Every function raises a ``ValueError`` naming the field, column, rows or path, and the fix. They are cheap: they
read dataset columns and config values, never a model. ``docs/reliability.md`` ("Validated inputs") lists them.
The one check that cannot run before training is on what reward functions return (:func:`reward_values`): it runs
on every call, through :class:`CheckedReward`, which the trainers wrap around their reward functions.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

_MAX_ROWS_SHOWN = 5


def _rows(rows: list[int]) -> str:
    shown = ", ".join(str(i) for i in rows[:_MAX_ROWS_SHOWN])
    return f"rows [{shown}{', ...' if len(rows) > _MAX_ROWS_SHOWN else ''}] ({len(rows)} in all)"


# ------------------------------------------------------------------------------------------ config time ---
# GRPOConfig's options and the methods' number fields: _config_checks.py
def check_cache_dir(value, config: str, field: str) -> None:
    """Refuse a cache directory of the offline pass that cannot be one: ``value`` (the option ``field`` of the config
    class named ``config``) or, when it is unset, ``$TRL_VARIANTS_CACHE`` (the default), naming a file or a path
    under a file. The pass creates the directory only after the model load, so the check must come first."""
    env = not value
    text = os.environ.get("TRL_VARIANTS_CACHE", "") if env else str(value)
    if not text:
        return  # ~/.cache/trl_variants/presample
    path = Path(text)  # as the pass uses it (presample.runner)
    blocker = next((p for p in (path, *path.parents) if os.path.exists(p)), None)
    if blocker is None or os.path.isdir(blocker):
        return
    what = "is a file" if blocker == path else f"is under {blocker}, a file"
    if env:
        raise ValueError(f"$TRL_VARIANTS_CACHE={text} (the default {config}.{field}) {what}, not a directory: point "
                         f"TRL_VARIANTS_CACHE at a directory (created when missing), unset it, or pass --{field} DIR")
    raise ValueError(f"{config}.{field}: {text} {what}, not a directory (the offline pass caches its results in a "
                     f"directory there): pass --{field} DIR ({field}=DIR in Python; created when missing), or move "
                     "the file away")


# ---------------------------------------------------------------------------------------- model paths ---
def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _looks_local(text: str) -> bool:
    if text.startswith((".", "/", "~")) or "\\" in text:
        return True
    head = text.split("/")[0]
    return "/" in text and bool(head) and os.path.isdir(head)  # "outputs/run-typo" where outputs/ exists


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on it
        return True
    try:
        return any(isinstance(try_to_load_from_cache(repo_id, f), str)
                   for f in ("config.json", "adapter_config.json"))
    except Exception:  # an invalid repo id
        return False


def check_model_reference(name_or_path, option: str = "model") -> None:
    """Refuse, before loading, a model path that does not exist or (with ``HF_HUB_OFFLINE`` set) a Hub id that is not
    in the local cache: transformers would only say it "couldn't connect to huggingface.co", without the path."""
    if name_or_path is None or not isinstance(name_or_path, str | os.PathLike):
        return  # a model object, or nothing asked
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.exists():
        if path.is_dir() and not any((path / f).exists() for f in ("config.json", "adapter_config.json")):
            raise ValueError(f"{option} {text!r} is a directory without config.json or adapter_config.json: not a "
                             "saved model. Pass the directory a trainer's save_model() wrote (or a checkpoint-N)")
        return
    if _looks_local(text):
        hub = ("; HF_HUB_OFFLINE is set, so nothing is downloaded from the Hub either" if _offline() else "")
        raise ValueError(f"{option} {text!r} does not exist (resolved to {path.resolve()}): check the spelling "
                         f"and the working directory, or pass a Hub id (org/name){hub}")
    if _offline() and not _in_hub_cache(text):
        raise ValueError(f"{option} {text!r} is not a local directory and not in the Hugging Face cache, and "
                         "HF_HUB_OFFLINE is set: check the spelling, pass a local model directory, or download it "
                         "once with HF_HUB_OFFLINE unset")


def check_model_paths(model, reward_funcs, who: str) -> None:
    """:func:`check_model_reference` for what a trainer loads by name, before it loads anything: the ``model`` and
    every reward function given as a Hub id or path (TRL loads it as a sequence-classification model). Named
    ``model`` and ``reward_funcs[i]``, prefixed with ``who``."""
    named = [("model", model)]
    funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    named += [(f"reward_funcs[{i}]", f) for i, f in enumerate(funcs) if isinstance(f, str | os.PathLike)]
    for option, value in named:
        try:
            check_model_reference(value, option)
        except ValueError as e:
            raise ValueError(f"{who}: {e}") from None


# -------------------------------------------------------------------------------------------- datasets ---
def _prompt_problem(prompt) -> str | None:
    if isinstance(prompt, str):
        return "empty string" if not prompt.strip() else None
    if isinstance(prompt, list | tuple):
        if not prompt:
            return "no message"
        if not all(isinstance(m, dict) and "content" in m for m in prompt):
            return "a message that is not a {'role', 'content'} dict"
        if not all(isinstance(m.get("role"), str) for m in prompt):  # None once stored: a column has one schema
            return "a message without a role"  # the chat template fails on it at the first batch
        for m in prompt:
            c = m["content"]
            if isinstance(c, str) and c.strip():
                return None
            if isinstance(c, list) and any(not isinstance(part, dict) or part.get("type") != "text"
                                           or str(part.get("text") or "").strip() for part in c):
                return None
        return "only empty message contents"
    return f"type {type(prompt).__name__}"


def check_train_dataset(dataset, trainer_name: str, split: str = "train_dataset") -> None:
    """A ``prompt`` column, and no empty prompt (empty string, no message, or only empty contents), naming rows."""
    if dataset is None or isinstance(dataset, dict):
        return
    columns = getattr(dataset, "column_names", None)
    if columns is None:  # an IterableDataset without known features: checked by TRL when it is read
        return
    if "prompt" not in columns:
        raise ValueError(f"{trainer_name}: the {split} has no 'prompt' column (columns: {columns}); rename the prompt "
                         "column with dataset.rename_column(..., 'prompt')")
    if not hasattr(dataset, "__len__"):
        return
    if len(dataset) == 0 and split == "train_dataset":
        raise ValueError(f"{trainer_name}: the {split} has no rows: training would run 0 steps and save the untouched "
                         "model. Check the dataset split and any filter (e.g. --filter_column / --filter_values)")
    problems: dict[str, list[int]] = {}
    for i, prompt in enumerate(dataset["prompt"]):
        why = _prompt_problem(prompt)
        if why is not None:
            problems.setdefault(why, []).append(i)
    if problems:
        detail = "; ".join(f"{why} at {_rows(rows)}" for why, rows in problems.items())
        raise ValueError(f"{trainer_name}: the {split}'s 'prompt' column has unusable prompts ({detail}): a prompt "
                         "must be a non-empty string or a non-empty list of chat messages. Remove them, e.g. "
                         "dataset.filter(...)")


def check_one_rollout_batch(dataset, args, trainer_name: str, when: str = "") -> None:
    """At least one rollout batch of prompts: TRL's sampler makes only whole batches of
    ``generation_batch_size / num_generations`` distinct prompts (all processes together), so a smaller dataset gives
    none, and transformers ends training at step 0 with a warning and saves the untouched model. Map-style datasets
    only: a stream's length is unknown until it is read (TRL drops its partial batch too)."""
    if dataset is None or isinstance(dataset, dict) or not hasattr(dataset, "__len__"):
        return
    prompts = args.generation_batch_size // args.num_generations
    if len(dataset) >= prompts:
        return
    processes = args.generation_batch_size // (args.per_device_train_batch_size * args.steps_per_generation)
    raise ValueError(
        f"{trainer_name}: the train_dataset has {len(dataset)} prompt{'s' if len(dataset) != 1 else ''}{when}, "
        "fewer than one rollout batch: "
        f"per_device_train_batch_size {args.per_device_train_batch_size} x {processes} process(es) x "
        f"steps_per_generation {args.steps_per_generation} = {args.generation_batch_size} completions = {prompts} "
        f"prompts x num_generations {args.num_generations}. TRL's sampler makes no batch from it, so training would "
        "run 0 steps and save the untouched model. Use more prompts (e.g. a larger --dataset_train_split slice), or "
        "a smaller rollout batch: lower per_device_train_batch_size or steps_per_generation (or generation_batch_size "
        "where you set it), or run on fewer processes (with trl-variants train or the example scripts also "
        "--keep_recipe_batch false: a recipe's global batch is kept on any number of processes otherwise)")


def check_trained_a_step(trainer, start_step: int) -> None:
    """After ``train()``: a run that should have trained (``max_steps`` past ``start_step``, the step it started or
    resumed at) and ran no step is an error, not transformers' warning ("not a single sample in your
    epoch_iterator") followed by a saved untouched model. What gets here is a stream (``IterableDataset``) smaller
    than one rollout batch: a map-style dataset is refused before the model loads (:func:`check_one_rollout_batch`)."""
    state, args = trainer.state, trainer.args
    if state.global_step > start_step or state.max_steps <= start_step:
        return
    prompts = args.generation_batch_size // args.num_generations
    stream = not hasattr(trainer.train_dataset, "__len__")
    raise ValueError(
        f"{type(trainer).__name__}: training ran 0 steps (from step {start_step} to max_steps {state.max_steps}): "
        f"the train_dataset gave no whole rollout batch of {prompts} prompts (generation_batch_size "
        f"{args.generation_batch_size} / num_generations {args.num_generations}; TRL drops a partial batch)"
        + (", and a stream's length is unknown until it is read, so this could not be refused before training"
           if stream else "")
        + ". The model was not trained. Use more prompts, or a smaller rollout batch: lower "
        "per_device_train_batch_size or steps_per_generation (or generation_batch_size where you set it), or run on "
        "fewer processes")


# ------------------------------------------------------------------------------------------ reward columns ---
_TRL_REWARD_KWARGS = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                      "environments", "kwargs"}


def reward_name(func) -> str:
    return getattr(func, "__name__", type(func).__name__)


def reward_func_names(reward_funcs) -> list[str]:
    """The names ``GRPOTrainer.__init__`` will give ``reward_funcs`` (its ``reward_func_names``), known before it
    loads anything: a function's name, or the last part of a reward model's id or path."""
    from torch import nn
    from trl.trainer.utils import get_config_model_id

    funcs = [] if reward_funcs is None else reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    return [str(f).split("/")[-1] if isinstance(f, str | os.PathLike)
            else get_config_model_id(f.config).split("/")[-1] if isinstance(f, nn.Module)
            else _reward_func_name(f) for f in funcs]


def check_reward_columns(reward_funcs: Sequence[Callable], column_names: Sequence[str]) -> None:
    """Raise (naming the function and the column) when a reward function has a required parameter that is neither
    part of TRL's reward signature nor a dataset column."""
    for func in reward_funcs:
        for name in _required_columns(func):
            if name not in column_names:
                raise ValueError(
                    f"reward function {reward_name(func)!r} needs the dataset column {name!r}, which the dataset "
                    f"does not have (columns: {list(column_names)}): add it or rename a column to {name!r}"
                )


def _required_columns(func) -> list[str]:
    """The dataset columns reward function ``func`` requires: its parameters without a default that are not part of
    TRL's reward signature (TRL passes every other column as a keyword argument; a parameter with a default, or
    ``**kwargs``, does not require one)."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.default is p.empty
            and p.name not in _TRL_REWARD_KWARGS]


def check_reward_column_values(reward_funcs, dataset, who: str) -> None:
    """No ``None`` in a column a reward function requires (naming the function, the column, the rows): the function
    would get ``None`` in its list (``accuracy_reward`` scored the text "None" 0, silently). Reward models and Hub ids
    (scored by TRL) read no column. A stream is not read here (its rows would be consumed before training)."""
    from torch import nn

    columns = getattr(dataset, "column_names", None)
    if columns is None or reward_funcs is None or isinstance(dataset, dict) or not hasattr(dataset, "__len__"):
        return
    funcs = reward_funcs if isinstance(reward_funcs, list | tuple) else [reward_funcs]
    seen: dict[str, list[int]] = {}
    for func in funcs:
        if not callable(func) or isinstance(func, nn.Module | str):
            continue
        for column in _required_columns(func):
            if column not in columns:
                continue  # a missing column is check_reward_columns's
            if column not in seen:
                seen[column] = [i for i, v in enumerate(dataset[column]) if v is None]
            if seen[column]:
                raise ValueError(
                    f"{who}: reward function {_reward_func_name(func)!r} requires the dataset column {column!r}, which "
                    f"is None at {_rows(seen[column])}: it would receive None for those rows. Fill them in, or drop "
                    f"those rows (e.g. dataset.filter(lambda x: x[{column!r}] is not None)), or give the function's "
                    f"{column!r} parameter a default if it handles None")


def check_reward_columns_before_load(reward_funcs, dataset, trainer_name: str) -> None:
    """Every dataset column a reward function requires (a parameter without default that is not part of TRL's
    reward signature) is a column of ``dataset`` and holds no ``None`` (:func:`check_reward_column_values`), checked
    before the model loads (GRPOTrainer would fail at the first reward call, after the model load and the first
    generation, or score the rows silently). Reward models and Hub ids are TRL's to score."""
    from torch import nn

    columns = getattr(dataset, "column_names", None)
    if columns is None or reward_funcs is None or isinstance(dataset, dict):
        return  # no dataset, or a stream of unknown features (checked when it is read)
    funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    try:
        check_reward_columns([f for f in funcs if callable(f) and not isinstance(f, nn.Module)], columns)
    except ValueError as e:
        raise ValueError(f"{trainer_name}: {e}") from None
    check_reward_column_values(funcs, dataset, trainer_name)


def check_finite_column(dataset, column: str, fix: str) -> None:
    """Every value of ``column`` is a finite number (naming the rows that are not)."""
    bad = [i for i, v in enumerate(dataset[column])
           if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)]
    if bad:
        example = dataset[bad[0]][column]
        raise ValueError(f"column {column!r} must hold finite numbers; {_rows(bad)} do not (e.g. {example!r}): {fix}")


def check_no_none(dataset, column: str, fix: str) -> None:
    """No ``None`` in ``column`` (naming the rows); a column that is absent is left to the reward's own check."""
    columns = getattr(dataset, "column_names", None)
    if columns is None or column not in columns or not hasattr(dataset, "__len__"):
        return
    bad = [i for i, v in enumerate(dataset[column]) if v is None]
    if bad:
        raise ValueError(f"column {column!r} is None at {_rows(bad)}: {fix}")


# ---------------------------------------------------------------------------------------------- tokenizer ---
def ensure_pad_token(tokenizer):
    """As ``GRPOTrainer`` does: a tokenizer without a pad token pads with its EOS token (Llama 3, Mistral)."""
    if tokenizer is not None and getattr(tokenizer, "pad_token", None) is None:
        if getattr(tokenizer, "eos_token", None) is None:
            raise ValueError(f"the tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has neither a pad token nor an "
                             "EOS token: set tokenizer.pad_token before passing it")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# ------------------------------------------------------------------------------------------- reward values ---
REWARD_FIX = ("a reward function must return a list with one number per completion (None: no reward for that "
              "completion), e.g. [float(r) for r in rewards]")


def _reward_func_name(func) -> str:
    """The name TRL gives a reward function (``trl.trainer.utils.get_callable_name``): partials unwrapped."""
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", type(func).__name__)


def _shown(value) -> str:
    text = " ".join(repr(value).split())  # one line, however the value prints
    return text if len(text) <= 80 else text[:77] + "..."


def reward_values(values, func, n: int) -> list[float]:
    """What reward function ``func`` returned for ``n`` completions, as floats (NaN for None: TRL's "no reward",
    excluded by its ``nansum``). Anything TRL's ``torch.tensor`` would choke on later without naming the function
    (a string: "too many dimensions 'str'"), the wrong number of values, or an infinite reward (its group's
    advantages become NaN) is refused here, naming the function, the completion index, the value and its type.
    Shared by the trainers (:class:`CheckedReward`) and the offline pass (``presample.reward_calls``)."""
    name = _reward_func_name(func)
    if isinstance(values, str | bytes | dict) or not hasattr(values, "__len__") or getattr(values, "ndim", 1) != 1:
        raise TypeError(f"reward function {name!r} returned {_shown(values)} ({type(values).__name__}) for {n} "
                        f"completions: {REWARD_FIX}")
    if len(values) != n:
        raise ValueError(f"reward function {name!r} returned {len(values)} values for {n} completions: {REWARD_FIX}")
    out = []
    for i, v in enumerate(values):
        if v is None:
            out.append(math.nan)
            continue
        try:
            if isinstance(v, str | bytes) or getattr(v, "ndim", 0) != 0:
                raise TypeError
            x = float(v)
        except (TypeError, ValueError):
            raise TypeError(f"reward function {name!r} returned {_shown(v)} ({type(v).__name__}) for completion {i} "
                            f"of {n}: {REWARD_FIX}") from None
        if math.isinf(x):
            raise ValueError(f"reward function {name!r} returned {x} for completion {i} of {n}: an infinite reward "
                             "makes its group's advantages NaN. Return a finite number, or None for no reward")
        out.append(x)
    return out


class CheckedReward:
    """A TRL reward function whose every return value goes through :func:`reward_values`, so a bad value is refused
    at the call that returned it, naming the function (``GRPOTrainer`` would fail later in ``torch.tensor`` with
    "too many dimensions 'str'"). It keeps what TRL and the offline pass read from the function: ``__name__`` (TRL's
    metric names), the signature (through ``__wrapped__``), and the cache fingerprint (``reward_fingerprint`` looks
    through it). Returns floats, NaN where the function returned None (TRL turns None into NaN itself). A NaN the
    function returned is kept (TRL treats it as None) and said once per wrapper, naming the function."""

    def __init__(self, func):
        self.__wrapped__ = func
        self.__name__ = _reward_func_name(func)
        self._said_nan = False

    @staticmethod
    def _count(args, kwargs) -> int:
        return len(kwargs["completions"] if "completions" in kwargs else args[1])

    def _checked(self, values, args, kwargs) -> list[float]:
        n = self._count(args, kwargs)
        out = reward_values(values, self.__wrapped__, n)
        if not self._said_nan:  # a NaN the function returned (not a None): said once per function, then kept quiet
            nan = [i for i, (v, x) in enumerate(zip(values, out, strict=True)) if v is not None and math.isnan(x)]
            if nan:
                self._said_nan = True
                warnings.warn(
                    f"reward function {self.__name__!r} returned NaN for completion {nan[0]} of {n} ({len(nan)} in this "
                    "call): treated as None, no reward from this function for that completion, as GRPOTrainer treats "
                    "it (its nansum and nanmean leave it out). Return None for no reward, or fix what makes it NaN "
                    "(e.g. 0 / 0). Said once for this function: later NaNs are not reported", stacklevel=3)
        return out

    def __call__(self, *args, **kwargs):
        return self._checked(self.__wrapped__(*args, **kwargs), args, kwargs)

    def __repr__(self) -> str:
        return f"CheckedReward({self.__wrapped__!r})"


class AsyncCheckedReward(CheckedReward):
    """:class:`CheckedReward` for an async reward function (TRL awaits it in its async reward path)."""

    async def __call__(self, *args, **kwargs):
        return self._checked(await self.__wrapped__(*args, **kwargs), args, kwargs)


def checked_reward_funcs(reward_funcs):
    """``reward_funcs`` as a trainer passes them to ``GRPOTrainer.__init__`` (None, one, or a list), with every plain
    callable wrapped in :class:`CheckedReward` (:class:`AsyncCheckedReward` when TRL would await it). Reward models
    (``nn.Module``) and Hub ids (str) are left as they are: TRL scores them itself."""
    from torch import nn
    from trl.trainer.utils import is_async_callable

    def wrap(func):
        if isinstance(func, str | nn.Module | CheckedReward) or not callable(func):
            return func
        return AsyncCheckedReward(func) if is_async_callable(func) else CheckedReward(func)

    if reward_funcs is None:
        return None
    return [wrap(f) for f in reward_funcs] if isinstance(reward_funcs, list) else wrap(reward_funcs)
