"""The part of docs/parts.md ("A part of your own"), executed from the doc, trains the same on 2 gloo processes as on
1 (same global batch, data order, seed and completions: ``harness.py``, case ``custom_part``), compared as every
trainer is (``test_equivalence.py``: every logged number, the final weights). Its loss term is a token mean over the
completions with a positive advantage, which the two processes hold in unequal numbers: the global helpers it uses
(``trainer.global_token_mean``, ``trainer.global_mean``) are what keeps the runs equal."""

import json

import pytest

from .test_equivalence import assert_same_run, launch


@pytest.mark.slow
def test_the_doc_part_trains_the_same_on_two_processes_as_on_one(tmp_path):
    launch(1, "custom_part", tmp_path / "one", 29637)
    launch(2, "custom_part", tmp_path / "two", 29638)
    assert_same_run(tmp_path / "one", tmp_path / "two")
    logged = [h for h in json.loads((tmp_path / "one" / "log_history.json").read_text()) if "loss/self_imitation" in h]
    assert len(logged) == 3 and all(h["loss/self_imitation"] > 0 for h in logged)  # the term was there at each step
    assert all(0 < h["self_imitation/better_fraction"] < 1 for h in logged)
