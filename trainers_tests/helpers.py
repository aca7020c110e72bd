"""Shared test fixtures: small trainer configs and a fixed, hand-built GRPO batch."""

from __future__ import annotations

import pytest
import torch
import transformers
from packaging.version import Version

from trl_variants.default import DEFAULT_MODEL_PATH, load_default_dataset
from trl_variants.generation import tokenize_prompts
from trl_variants.registry import PAPER_METHODS, method_classes

READS_WHILE_GENERATING = Version(transformers.__version__) >= Version("5.2")
"""EEPO reads stage 2's log-probs while generating (capture_stage2_logps): transformers 5.0's decoding loop is not the
one it reads (EEPO falls back to the separate forward, with a warning); 5.2, 5.5, 5.8, 5.17 and 5.24 are (checked)."""
needs_reading_while_generating = pytest.mark.skipif(
    not READS_WHILE_GENERATING, reason=f"transformers {transformers.__version__}'s decoding loop is not the one EEPO "
                                       "reads stage 2's log-probs from (5.2 and later); EEPO falls back there")
HAS_CONTINUOUS_BATCHING = Version(transformers.__version__) >= Version("5.8")
needs_continuous_batching = pytest.mark.skipif(
    not HAS_CONTINUOUS_BATCHING,
    reason=f"transformers {transformers.__version__} has no continuous batching (5.8 and later; TRL 1.16 requires 5.8 "
           "for it too); the trainers, the offline pass and evaluate refuse it there by name "
           "(test_a_transformers_without_continuous_batching_is_refused_by_name, with the version patched)")

CPU_ARGS = dict(
    use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1, seed=0,
    gradient_checkpointing=False, disable_tqdm=True,
)


def small_config(config_cls, tmp_path, **overrides):
    kwargs = dict(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_completion_length=24,
        learning_rate=1e-3, max_steps=2, **CPU_ARGS,
    )
    kwargs.update(overrides)
    return config_cls(**kwargs)


def train_dataset(n=32, seed=0):
    return load_default_dataset(n_train=n, n_test=8, seed=seed)["train"]


def fixed_batch(trainer, n_prompts=2, group=2, seed=0):
    """A generation-batch dict as ``_generate_and_score_completions`` returns it: the first ``n_prompts`` prompts
    of the default task, each with ``group`` completions (the reference solution and a wrong variant), fixed
    advantages. Row ``i`` belongs to prompt ``i // group``."""
    ds = load_default_dataset(n_train=n_prompts, n_test=1, seed=seed, with_reference=True)["train"]
    tok = trainer.processing_class
    p_ids = tokenize_prompts(tok, ds["prompt"])
    comps = []
    for row in ds["completion"]:
        good = row[0]["content"]
        comps += [good, good.replace("\\boxed{", "\\boxed{1")][:group] + [good] * max(0, group - 2)
    c_ids = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in comps]
    rows_p = [p for p in p_ids for _ in range(group)]
    P, C = max(map(len, rows_p)), max(map(len, c_ids))
    n = len(rows_p)
    prompt_ids = torch.full((n, P), tok.pad_token_id)
    prompt_mask = torch.zeros((n, P), dtype=torch.long)
    completion_ids = torch.full((n, C), tok.pad_token_id)
    completion_mask = torch.zeros((n, C), dtype=torch.long)
    for i, (p, c) in enumerate(zip(rows_p, c_ids, strict=True)):
        prompt_ids[i, P - len(p):], prompt_mask[i, P - len(p):] = torch.tensor(p), 1
        completion_ids[i, : len(c)], completion_mask[i, : len(c)] = torch.tensor(c), 1
    advantages = torch.tensor([1.0, -1.0] * (n // 2) + [0.5] * (n % 2))
    return {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
        "completion_mask": completion_mask, "advantages": advantages, "num_items_in_batch": completion_mask.sum(),
    }, ds


def loss_and_grads(trainer, inputs):
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer.compute_loss(model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def assert_same_grads(a, b, atol=1e-7):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=1e-5, msg=name)


__all__ = ["DEFAULT_MODEL_PATH", "CPU_ARGS", "fixed_batch", "loss_and_grads", "small_config", "train_dataset"]


def grpo_trainer(tmp_path, **kw):
    """The TRL baseline on the same model, data and small config."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_variants import accuracy_reward

    return GRPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward,
                       args=small_config(GRPOConfig, tmp_path / "grpo", **kw), train_dataset=train_dataset())


def assert_exactly_grpo(grpo, other, inputs):
    """Same loss and same gradients, bit for bit, on the same batch."""
    loss_g, grads_g = loss_and_grads(grpo, inputs)
    loss_o, grads_o = loss_and_grads(other, inputs)
    assert torch.equal(loss_g, loss_o)
    assert_same_grads(grads_g, grads_o, atol=0.0)


DESTROY_PROCESS_GROUP = """
import os, sys
import torch.distributed
if torch.distributed.is_initialized():
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)
"""


def run_two_ranks(script, port: int, timeout: int = 300):
    """Run ``script`` on two gloo ranks (``torchrun``, CPU); each rank must print OK.

    The script gets an epilogue that destroys the process group, then leaves without the interpreter's teardown: Gloo's
    worker threads can outlive the interpreter and abort the process at exit (SIGABRT, "terminate called without an
    active exception", pytorch/pytorch#190489), seen in CI under a trainer's DDP model even after the group was
    destroyed. The epilogue runs only when the script reached its end; what it checks is what the ranks computed.
    """
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(script)
    script.write_text(script.read_text() + DESTROY_PROCESS_GROUP)

    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_port", str(port), str(script)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 and proc.stdout.count("OK") == 2, proc.stderr[-3000:]
    return proc


def script_finished(proc) -> bool:
    """An example script's run (a ``CompletedProcess``) reached its last line (``model saved to``) and exited 0, or,
    after that line, a process aborted in the interpreter's teardown: Gloo's worker threads outliving the interpreter
    (SIGABRT, "terminate called without an active exception", pytorch/pytorch#190489; :func:`run_two_ranks` leaves
    without the teardown instead, which a script run as users run it cannot). Seen on a loaded 2-core machine in
    about 1 of 4 two-process runs (docs/reliability.md, "Preemption"); the outputs are complete."""
    said = proc.stdout + proc.stderr
    end = said.rfind("model saved to")
    return end >= 0 and (proc.returncode == 0 or "terminate called without an active exception" in said[end:])


HINT_TEMPLATE = ("{% if system_hint %}{{ '<|im_start|>system\\n' + system_hint + '<|im_end|>\\n' }}{% endif %}"
                 "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                 "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{% endif %}")


def hinted_tokenizer():
    """The tiny tokenizer with a chat template that renders a system line when ``chat_template_kwargs`` pass
    ``system_hint``: tokenizing with and without the trainer's kwargs gives different prompt ids."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    tok.chat_template = HINT_TEMPLATE
    return tok


TRAINERS = {name: method_classes(name) for name in PAPER_METHODS}
"""Each method's (trainer class, config class), by short name."""

# The smallest settings of each method's own options that still run its offline pass.
SMALL_METHOD_ARGS = {"erpo": {}, "eepo": {}, "dph": dict(num_presamples=2, pef_threshold=2),
                     "apo": dict(num_generations=1, num_value_samples=2)}


def small_trainer(method, tmp_path, dataset=None, reward_funcs=None, trainer_kwargs=None, **overrides):
    """A ``method`` trainer on the tiny default with :func:`small_config` and the smallest offline pass (cached under
    ``tmp_path``). ``trainer_kwargs``: more arguments of the trainer itself (``eval_dataset``, ``peft_config``...)."""
    from trl_variants import accuracy_reward

    trainer_cls, config_cls = TRAINERS[method]
    kwargs = dict(SMALL_METHOD_ARGS[method], **overrides)
    if method in ("dph", "apo"):
        kwargs.setdefault("presample_cache_dir", str(tmp_path / "cache"))
    return trainer_cls(model=DEFAULT_MODEL_PATH, reward_funcs=reward_funcs or accuracy_reward,
                       args=small_config(config_cls, tmp_path, **kwargs),
                       train_dataset=dataset if dataset is not None else train_dataset(16), **(trainer_kwargs or {}))


def tiny_reward_model(path, seed: int = 0) -> str:
    """Save a randomly initialised one-layer ``LlamaForSequenceClassification`` (``num_labels=1``) with the tiny
    default's tokenizer (chat template included) to ``path``, as a stand-in for a reward model on the Hub; returns
    the path. Built locally, nothing downloaded."""
    from transformers import AutoConfig, AutoTokenizer, LlamaForSequenceClassification

    config = AutoConfig.from_pretrained(DEFAULT_MODEL_PATH)
    config.update(dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                       num_key_value_heads=2, head_dim=16, num_labels=1, architectures=None))
    torch.manual_seed(seed)
    LlamaForSequenceClassification(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH).save_pretrained(path)
    return str(path)


def seeded_rollouts(trainers, prompts=(0, 1), group=4):
    """Each trainer's ``_generate_and_score_completions`` on the same rows (``group`` copies of each of the first
    trainer's ``prompts``), each from the same seed, in training mode."""
    rows = [trainers[0].train_dataset[i] for i in prompts for _ in range(group)]
    outs = []
    for trainer in trainers:
        trainer.model.train()
        torch.manual_seed(7)
        outs.append(trainer._generate_and_score_completions([dict(r) for r in rows]))
    return outs


def assert_same_rollout(grpo, other, prompts=(0, 1), group=4):
    """``other`` samples, scores and prepares the same rollout as ``grpo`` from the same seed: the same keys and
    equal values (completions, rewards, advantages, old and reference log-probs where computed). A method's
    rollout-side addition left on where it should be off changes one of them."""
    a, b = seeded_rollouts((grpo, other), prompts, group)
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, b[key]), key
        else:
            assert value == b[key], key


def rollouts_with_and_without_query_weights(plain, weighted, prompts=(0, 1), group=4):
    """The same rollouts (same seed, same rows) scored by ``plain`` and by ``weighted`` (its ``erpo_query_weights``
    part on); asserts they sampled the same completions and that ``weighted``'s advantages are ``plain``'s times the
    part's w(s). Returns both outputs."""
    out = dict(zip(("plain", "weighted"), seeded_rollouts((plain, weighted), prompts, group), strict=True))
    assert torch.equal(out["plain"]["completion_ids"], out["weighted"]["completion_ids"])
    w = weighted.part("erpo_query_weights").weights(weighted, None, out["weighted"])
    torch.testing.assert_close(out["weighted"]["advantages"], out["plain"]["advantages"] * w)
    return out["plain"], out["weighted"]
