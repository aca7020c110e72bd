"""trl_variants/presample/logprobs.py: a scoring forward's logits stay within a budget (long rows, large vocabularies,
as in evaluating a real model on a GPU), with the same values."""

from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM

from trl_variants.presample import logprobs
from trl_variants.presample.logprobs import left_pad, rows_per_forward, token_logps

from ..helpers import DEFAULT_MODEL_PATH


def test_a_forward_takes_fewer_rows_where_its_logits_would_pass_the_budget_and_scores_the_same(monkeypatch):
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH)
    ids, mask = left_pad([[5, 6, 7, 8, 9, 10], [11, 12, 13], [7, 7, 7, 7], [20, 21, 22, 23, 24], [9, 8]], pad_id=0)
    rows = []
    model.register_forward_pre_hook(lambda m, args, kwargs: rows.append(kwargs["input_ids"].size(0)), with_kwargs=True)
    whole, whole_entropy = token_logps(model, ids, mask, batch_size=8, with_entropy=True)
    assert rows == [5]
    vocab = model.get_output_embeddings().weight.size(0)
    monkeypatch.setattr(logprobs, "LOGITS_PER_FORWARD", 2 * (ids.size(1) - 1) * vocab)  # two rows' logits
    rows.clear()
    split, split_entropy = token_logps(model, ids, mask, batch_size=8, with_entropy=True)
    assert rows == [2, 2, 1]
    torch.testing.assert_close(split, whole, rtol=1e-6, atol=1e-6)  # float noise of another batch shape
    torch.testing.assert_close(split_entropy, whole_entropy, rtol=1e-6, atol=1e-6)  # float noise of another batch shape


def test_evaluations_default_batch_of_long_rows_of_qwens_vocabulary_is_cut_to_fit():
    # the config's vocabulary: under DeepSpeed ZeRO-3 the partitioned head holds 0 rows on each process
    qwen = SimpleNamespace(config=SimpleNamespace(vocab_size=151936),
                           get_output_embeddings=lambda: SimpleNamespace(weight=torch.empty(0, 0)))
    assert rows_per_forward(qwen, 32, 4097) == 1  # 32 x 4096 x 151936 float32 logits: 80 GB a copy
    assert rows_per_forward(qwen, 32, 513) == 3
    assert rows_per_forward(qwen, 32, 17) == 32  # short rows: the batch as asked
