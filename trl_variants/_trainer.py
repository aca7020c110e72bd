"""What every trainer here shares with the others around GRPOTrainer: its config resolved as TRL resolves it, the
reference columns added to evaluation datasets (the numerical guards are in ``_numerics.py``)."""

from __future__ import annotations


def resolve_config(model, args, config_cls, suffix: str):
    """``args`` checked to be a ``config_cls``; when None, a default one named ``<model name>-<suffix>`` (as TRL does
    for GRPOTrainer)."""
    if args is None:
        name = model if isinstance(model, str) else model.config._name_or_path
        return config_cls(f"{str(name).rstrip('/').split('/')[-1]}-{suffix}")
    if not isinstance(args, config_cls):
        raise TypeError(f"args must be a {config_cls.__name__}, got {type(args).__name__}: build one with "
                        f"{config_cls.__name__}(...)")
    return args


class EvalDatasetMixin:
    """Per-prompt columns a trainer's loss reads (a reference quantity), added to every evaluation dataset: those
    given at construction (:meth:`prepare_eval_datasets`, called in ``__init__``) and those passed later to
    ``evaluate(eval_dataset=...)``, a dict of them included. Mix in before ``GRPOTrainer``; the trainer defines
    :meth:`_with_eval_columns` (one dataset in, the same rows with the columns out)."""

    def _with_eval_columns(self, dataset):
        raise NotImplementedError

    def _eval_datasets_with_columns(self, datasets):
        if datasets is None or isinstance(datasets, str):  # a str names one of self.eval_dataset's, already done
            return datasets
        if isinstance(datasets, dict):
            return {name: self._with_eval_columns(d) for name, d in datasets.items()}
        return self._with_eval_columns(datasets)

    def prepare_eval_datasets(self) -> None:
        self.eval_dataset = self._eval_datasets_with_columns(self.eval_dataset)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        return super().evaluate(self._eval_datasets_with_columns(eval_dataset), ignore_keys, metric_key_prefix)
