"""What every trainer here shares with the others around GRPOTrainer: its config resolved as TRL resolves it, the
reference columns added to evaluation datasets, and :class:`TrainerBase`, the base of the parts trainer and A*-PO's
(the mixins they share, the checks before anything loads; the numerical guards are in ``_numerics.py``)."""

from __future__ import annotations

from trl import GRPOConfig, GRPOTrainer

from ._card import ModelCardMixin
from ._checkpoint import CheckpointStateMixin
from ._model import full_state_dict_for_final_save, whole_value
from ._numerics import FiniteTrainingMixin
from ._offline import OfflinePassLogMixin
from ._preemption import StopOnSignalMixin, check_stop_on_signal_args
from ._validation import (
    check_model_paths,
    check_one_rollout_batch,
    check_reward_columns_before_load,
    check_train_dataset,
    checked_reward_funcs,
)


def resolve_config(model, args, config_cls, suffix: str):
    """``args`` checked to be a ``config_cls``; when None, a default one named ``<model name>-<suffix>`` (as TRL does
    for GRPOTrainer)."""
    if args is None:
        name = model if isinstance(model, str) else model.config._name_or_path
        return config_cls(f"{str(name).rstrip('/').split('/')[-1]}-{suffix}")
    if not isinstance(args, config_cls):
        article = "an" if config_cls.__name__[0] in "AEIOU" else "a"
        raise TypeError(f"args must be {article} {config_cls.__name__}, got {type(args).__name__}: build one with "
                        f"{config_cls.__name__}(...)")
    return args


class EvalDatasetMixin:
    """Per-prompt columns a trainer's loss reads (a reference quantity), added to every evaluation dataset: those
    given at construction (computed in ``__init__`` by :meth:`prepare_eval_datasets`, from the model as given) and
    those passed later to ``evaluate(eval_dataset=...)``, a dict of them included. The user's objects are kept as
    they are (``trainer.eval_dataset is eval_dataset``, as TRL's own tests assert): the copies with the columns are
    what :meth:`get_eval_dataloader` iterates. Mix in before ``GRPOTrainer``; the trainer defines
    :meth:`_with_eval_columns` (one dataset in, the same rows with the columns out)."""

    def _with_eval_columns(self, dataset):
        raise NotImplementedError

    def _eval_copy(self, dataset, keep: bool = True):
        """``dataset`` with the columns, computed once per dataset object of ``self.eval_dataset`` (``keep``: kept
        with the object, so its id stays its own); one passed to ``evaluate()`` reuses them when it is one of those."""
        if dataset is None:
            return dataset
        done = self.__dict__.setdefault("_eval_copies", {})
        if id(dataset) in done:
            return done[id(dataset)][1]
        copy = self._with_eval_columns(dataset)
        if keep:
            done[id(dataset)] = (dataset, copy)
        return copy

    def _eval_copies_of(self, datasets):
        if isinstance(datasets, dict):
            return {name: self._eval_copy(d) for name, d in datasets.items()}
        return self._eval_copy(datasets)

    def prepare_eval_datasets(self) -> None:
        self._eval_copies_of(self.eval_dataset)

    def get_eval_dataloader(self, eval_dataset=None):
        if eval_dataset is not None and not isinstance(eval_dataset, str):  # passed to evaluate()
            return super().get_eval_dataloader(self._eval_copy(eval_dataset, keep=False))
        # None or the name of one of self.eval_dataset's: GRPOTrainer looks it up there (and keys its dataloader by
        # that name), so it sees the copies while it builds the dataloader
        given = self.eval_dataset
        if isinstance(eval_dataset, str) and isinstance(given, dict):
            self.eval_dataset = {**given, eval_dataset: self._eval_copy(given[eval_dataset])}
        else:
            self.eval_dataset = self._eval_copies_of(given)
        try:
            return super().get_eval_dataloader(eval_dataset)
        finally:
            self.eval_dataset = given


class TrainerBase(CheckpointStateMixin, StopOnSignalMixin, ModelCardMixin, FiniteTrainingMixin, OfflinePassLogMixin,
                  EvalDatasetMixin, GRPOTrainer):
    """``GRPOTrainer`` with what every trainer here adds around it: the checkpoint record and resume checks, the model
    card, the stop on a non-finite loss, the checkpoint and stop on SIGTERM (``enable_jit_checkpoint``), the offline
    pass's numbers in the first log, the reference columns of evaluation datasets. A subclass's ``__init__`` calls :meth:`_checked_args` first and :meth:`_checked_reward_funcs`
    last, before ``GRPOTrainer.__init__`` loads anything. ``_config_class`` is the config class ``args`` must be an
    instance of (default :class:`~trl.GRPOConfig`), ``_config_suffix`` names the default output directory when
    ``args`` is None."""

    _config_class = GRPOConfig
    _config_suffix = "GRPO"

    def _checked_args(self, model, args, train_dataset):
        """``args`` resolved (:func:`resolve_config`), and the train_dataset's prompts checked."""
        args = resolve_config(model, args, self._config_class or GRPOConfig, self._config_suffix)
        check_train_dataset(train_dataset, type(self).__name__)  # before GRPOTrainer loads the model
        check_stop_on_signal_args(args, type(self).__name__)
        return args

    def save_model(self, output_dir=None, _internal_call=False):
        """transformers' ``save_model``; under FSDP the final model is saved whole whatever the checkpoints' state dict
        type (:func:`~trl_variants._model.full_state_dict_for_final_save`)."""
        with full_state_dict_for_final_save(self, final=not _internal_call):
            return super().save_model(output_dir, _internal_call)

    def push_to_hub(self, *args, **kwargs):
        """transformers' ``push_to_hub`` (which saves the model first), with the whole model under FSDP as above."""
        with full_state_dict_for_final_save(self):
            return super().push_to_hub(*args, **kwargs)

    def _get_grad_norm(self, model, grad_norm=None):
        """transformers' gradient norm, whole on every process under FSDP2 (:func:`~trl_variants._model.whole_value`:
        torch 2.8 logged one process's share)."""
        return whole_value(super()._get_grad_norm(model, grad_norm))

    def get_train_dataloader(self):
        """transformers' dataloader, refused when it holds no batch: when the dataset trained on has fewer prompts than
        one rollout batch (an offline pass made it smaller: DPH-RL's D_exp, A*-PO's valued prompts), training would
        run 0 steps."""
        check_one_rollout_batch(self.train_dataset, self.args, type(self).__name__, " to train on")
        return super().get_train_dataloader()

    def _checked_reward_funcs(self, model, reward_funcs, train_dataset, args=None):
        """The last checks before anything loads (every column a reward function requires; a model or reward model
        path that does not exist, or a Hub id offline and not cached; at least one rollout batch of prompts), and
        ``reward_funcs`` as GRPOTrainer gets them: a bad reward value is refused naming the function
        (:func:`~trl_variants._validation.checked_reward_funcs`)."""
        name = type(self).__name__
        check_reward_columns_before_load(reward_funcs, train_dataset, name)
        check_model_paths(model, reward_funcs, name)
        if args is not None:  # (a subclass written before this check passes none)
            check_one_rollout_batch(train_dataset, args, name)
        return checked_reward_funcs(reward_funcs)
