"""Streaming datasets in the offline passes (``trl_variants._data``): the pass's values on a stream equal those of
the same rows as an in-memory dataset, and the trainer keeps the user's stream, in its order."""

from datasets import Dataset, IterableDataset

from trl_variants._data import prompt_key, stream_with_columns

from .helpers import small_trainer, train_dataset


def test_stream_with_columns_looks_up_by_prompt_and_keeps_order():
    rows = Dataset.from_dict({"prompt": ["a", "b", "c", "b"], "x": [1, 2, 3, 4]})
    table = Dataset.from_dict({"prompt": ["c", "b"], "v": [30.0, 20.0]})  # "a" was left out by the pass
    out = list(stream_with_columns(rows.to_iterable_dataset(), table, ["v"]))
    assert [(r["prompt"], r["x"], r["v"]) for r in out] == [("b", 2, 20.0), ("c", 3, 30.0), ("b", 4, 20.0)]
    assert prompt_key([{"role": "user", "content": "q"}]) == prompt_key([{"content": "q", "role": "user"}])


def test_erpo_reference_pass_on_a_stream_equals_the_in_memory_pass(tmp_path):
    data = train_dataset(16)
    kw = dict(query_kl_coef=0.1)
    in_memory = small_trainer("erpo", tmp_path / "a", dataset=data, **kw)
    streamed = small_trainer("erpo", tmp_path / "b", dataset=data.to_iterable_dataset(), **kw)
    assert isinstance(streamed.train_dataset, IterableDataset)  # still the user's stream
    rows = list(streamed.train_dataset)
    assert [r["prompt"] for r in rows] == data["prompt"]  # in the stream's order, every row
    assert [r["ref_prompt_logp"] for r in rows] == in_memory.train_dataset["ref_prompt_logp"]
    assert streamed._ref_prompt_logp_mean == in_memory._ref_prompt_logp_mean


def test_dph_split_on_a_stream_equals_the_in_memory_split(tmp_path):
    data = train_dataset(16)
    in_memory = small_trainer("dph", tmp_path / "a", dataset=data)
    streamed = small_trainer("dph", tmp_path / "b", dataset=data.to_iterable_dataset())
    assert streamed.split_stats == in_memory.split_stats
    assert [r["prompt"] for r in streamed.train_dataset] == in_memory.train_dataset["prompt"]
    assert streamed.pef_dataset["completion_ids"] == in_memory.pef_dataset["completion_ids"]
