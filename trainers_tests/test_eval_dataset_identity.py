"""The trainers add their reference columns (ERPO's ``ref_prompt_logp``, A*-PO's ``ref_value``)
to the evaluation datasets without replacing the user's objects: ``trainer.eval_dataset is eval_dataset``, as TRL's
own tests assert for GRPOTrainer, for one dataset and for a dict of them (the dict and each dataset). The evaluation
still reads the columns: its metrics equal those of the same datasets with the columns added by hand."""

from __future__ import annotations

import math
import warnings

import pytest
from transformers import set_seed

from trl_variants._offline import trainer_prompt_ids
from trl_variants.erpo.reference import add_reference_prompt_logps

from .helpers import load_default_dataset, small_trainer

COLUMN = {"erpo": "ref_prompt_logp", "apo": "ref_value"}
OVERRIDES = {"erpo": dict(query_kl_coef=0.1, query_weight_source="reference"), "apo": {}}
# timings and the offline pass's numbers (logged with the first evaluation only) are not the evaluation's result
NOT_COMPARED = ("runtime", "per_second", "offline_pass/")


def by_hand(trainer, method, dataset):
    """``dataset`` with the column the evaluation reads, added here: ERPO's l_ref(s) through the reference function
    (not the trainer's fused kernel); A*-PO's V_hat as its stage 1 computed it (a sampled quantity)."""
    if method == "erpo":
        values = add_reference_prompt_logps(
            dataset, trainer.model, trainer.processing_class, temperature=trainer.temperature,
            tokenize_fn=lambda rows: trainer_prompt_ids(trainer, rows))[COLUMN[method]]
    else:
        values = trainer._with_eval_columns(dataset)[COLUMN[method]]
    return dataset.add_column(COLUMN[method], values)


def evaluate(trainer, eval_dataset=None):
    set_seed(0)  # the same completions
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a hand-made column has no record of how it was made
        out = trainer.evaluate(eval_dataset=eval_dataset)
    return {k: v for k, v in out.items() if not any(s in k for s in NOT_COMPARED)}


@pytest.mark.parametrize("kind", ["one", "dict"])
@pytest.mark.parametrize("method", ["erpo", "apo"])
def test_eval_dataset_is_the_users_object_and_is_evaluated_with_the_columns(method, kind, tmp_path):
    test = load_default_dataset(n_train=16, n_test=8, seed=0)["test"]
    sets = {"a": test.select(range(4)), "b": test.select(range(4, 8))}
    given = sets["a"] if kind == "one" else sets
    trainer = small_trainer(method, tmp_path, trainer_kwargs=dict(eval_dataset=given), **OVERRIDES[method])

    def same_objects():
        assert trainer.eval_dataset is given
        if kind == "dict":
            assert all(trainer.eval_dataset[name] is d for name, d in sets.items())
        assert all(COLUMN[method] not in d.column_names for d in sets.values())  # untouched

    same_objects()
    auto = evaluate(trainer)
    same_objects()
    hand = by_hand(trainer, method, given) if kind == "one" else {n: by_hand(trainer, method, d)
                                                                 for n, d in given.items()}
    manual = evaluate(trainer, hand)
    same_objects()
    assert auto.keys() == manual.keys() and any(k.endswith("loss") for k in auto)
    for key, value in auto.items():
        assert math.isclose(value, manual[key], rel_tol=1e-4, abs_tol=1e-6), (key, value, manual[key])
