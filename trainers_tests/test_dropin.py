"""The drop-in matrix: GRPOTrainer's own behaviours, run against GRPOTrainer and each of the four trainers with their
additions on. Every cell either works (trains a step, or evaluates, and the behaviour's effect is checked) or is
refused at construction with a message naming why; a crash or a silent no-op fails. ``EXPECTED`` is the table the
docs/trainers.md's "Drop-in matrix" shows (``test_readme_table_matches`` keeps the two equal).

Each behaviour is one small run on the tiny default (or a tiny model of another architecture built from a config),
one optimizer step, the offline passes at their smallest, so the whole matrix stays within a few minutes on CPU.
"""

from __future__ import annotations

import asyncio
import math
import re
from pathlib import Path

import pytest
import torch
from transformers import TrainerState

from trl_variants import accuracy_reward
from trl_variants.default import load_default_dataset

from .helpers import DEFAULT_MODEL_PATH, SMALL_METHOD_ARGS, TRAINERS, small_config, tiny_reward_model

METHODS = ["grpo", "erpo", "eepo", "dph", "apo"]
WORKS = "works"

# behaviour -> method -> "works" or the refusal's reason (a substring of the error message, also the README's text)
EXPECTED: dict[str, dict[str, str]] = {
    "eval_dataset (dict of sets, eval during training, evaluate(eval_dataset=...) later)": {m: WORKS for m in METHODS},
    "streaming train_dataset (IterableDataset)": {m: WORKS for m in METHODS},
    "several reward functions, weights, None values, extra dataset columns": {m: WORKS for m in METHODS},
    "async reward function": {m: WORKS for m in METHODS},
    "trainer_state, log_extra, log_metric in reward functions": {m: WORKS for m in METHODS},
    "reward model (sequence classification) with its tokenizer": {m: WORKS for m in METHODS},
    "generation_kwargs (num_beams=2, fewer beams than samples)": {m: WORKS for m in METHODS},
    "chat_template_kwargs": {m: WORKS for m in METHODS},
    "num_iterations=2, steps_per_generation=2": {m: WORKS for m in METHODS},
    "odd num_generations (3)": {m: WORKS for m in METHODS},
    "mask_truncated_completions=True": {**{m: WORKS for m in METHODS},
                                        "apo": "every sample's reward is a regression target"},
    "top_entropy_quantile=0.5 (entropy masking)": {**{m: WORKS for m in METHODS},
                                                   "apo": "the regression has no entropy mask"},
    "entropy bonus (entropy_coef=0.01)": {m: WORKS for m in METHODS},
    "adaptive entropy bonus (use_adaptive_entropy=True)": {
        **{m: WORKS for m in METHODS}, "apo": "the optional entropy bonus uses the fixed entropy_coef"},
    "every loss_type x importance_sampling_level": {**{m: WORKS for m in METHODS},
                                                   "apo": "not one of GRPO's surrogate losses"},
    "beta > 0 (KL to the reference)": {m: WORKS for m in METHODS},
    "PEFT (LoRA adapter)": {m: WORKS for m in METHODS},
    "Qwen2-style model": {m: WORKS for m in METHODS},
    "Qwen3-MoE-style model (router aux loss)": {m: WORKS for m in METHODS},
    "tools (a python function the model calls)": {
        **{m: WORKS for m in METHODS}, "eepo": "does not support tools= (two-stage rollouts are single-turn)",
        **dict.fromkeys(["dph", "apo"], "the offline pass samples one turn and cannot run tool calls")},
    "environment_factory (reset() observation, a tool method, rewards read the environments)": {
        **{m: WORKS for m in METHODS},
        "eepo": "does not support environment_factory= (two-stage rollouts are single-turn)",
        **dict.fromkeys(["dph", "apo"], "the offline pass cannot run the environments")},
    "environment_factory without a train_dataset (reset() makes each task)": {
        "grpo": WORKS, "erpo": "reset() made a different prompt for the same row",
        "eepo": "does not support environment_factory= (two-stage rollouts are single-turn)",
        **dict.fromkeys(["dph", "apo"], "needs a train_dataset")},
}

# each method's own additions, switched on (ERPO's Query-KL is off by default; EEPO's paper gate, held open by alpha,
# so every rollout unlearns and stage 1's entropy is read while generating where the default allows it)
METHOD_ARGS = {"grpo": {}, "erpo": dict(query_kl_coef=0.1), "eepo": dict(entropy_gate="auto", entropy_threshold=100.0),
               "dph": dict(SMALL_METHOD_ARGS["dph"]), "apo": dict(SMALL_METHOD_ARGS["apo"])}


def _dataset(n=16):
    return load_default_dataset(n_train=n, n_test=8, seed=0)


DEFAULT_DATASET = object()


def make(method, tmp_path, *, model=DEFAULT_MODEL_PATH, dataset=DEFAULT_DATASET, reward_funcs=None,
         trainer_kwargs=None, **config):
    """A ``method`` trainer (``"grpo"``: TRL's GRPOTrainer) with its additions on, one optimizer step."""
    from trl import GRPOConfig, GRPOTrainer

    trainer_cls, config_cls = (GRPOTrainer, GRPOConfig) if method == "grpo" else TRAINERS[method]
    kwargs = {**METHOD_ARGS[method], "max_steps": 1, "per_device_train_batch_size": 16, **config}
    if method in ("dph", "apo"):
        kwargs.setdefault("presample_cache_dir", str(tmp_path / "cache"))
    return trainer_cls(model=model, reward_funcs=reward_funcs if reward_funcs is not None else DENSE,
                       args=small_config(config_cls, tmp_path / method, **kwargs),
                       train_dataset=_dataset()["train"] if dataset is DEFAULT_DATASET else dataset,
                       **(trainer_kwargs or {}))


def train_changes_model(trainer):
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert changed, "one optimizer step changed no trainable weight"
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def method_metric(method) -> str | None:
    return {"erpo": "erpo/query_kl", "dph": "dph/loss_pef", "apo": "apo/regression_loss",
            "eepo": "eepo/gate"}.get(method)


def length_reward(completions, **kwargs):
    """A dense reward (completion length / 20): every group has a spread of rewards, so one step always has a
    gradient (with accuracy alone a small batch can hold only all-right / all-wrong groups)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [len(t) / 20 for t in texts]


def accuracy_and_length(completions, **kwargs):
    return [a + 0.1 * n for a, n in zip(accuracy_reward(completions=completions, **kwargs),
                                        length_reward(completions), strict=True)]


DENSE = [accuracy_reward, length_reward]  # DPH-RL's correctness comes from accuracy_reward alone


# --------------------------------------------------------------------------------------------- behaviours ---
def eval_dataset(method, tmp_path):
    data = _dataset()
    sets = {"a": data["test"].select(range(4)), "b": data["test"].select(range(4, 8))}
    trainer = make(method, tmp_path, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=4,
                   trainer_kwargs=dict(eval_dataset=sets))
    assert trainer.eval_dataset.keys() == sets.keys()
    first = trainer.evaluate()  # before training: the returned dict holds TRL's metrics, as GRPOTrainer's does
    assert "eval_rewards/accuracy_reward/mean" in first
    assert not any(k.startswith("offline_pass/") for k in first)  # the pass's numbers wait for the training log
    train_changes_model(trainer)
    trained = [row for row in trainer.state.log_history if "loss" in row]
    assert ("offline_pass/seconds" in trained[0]) == (method in ("erpo", "dph", "apo"))
    # TRL names the loss per set (eval_a_loss) and its own metrics without the set's name (eval_reward)
    logged = [row for row in trainer.state.log_history if "eval_a_loss" in row]
    assert logged and 0 <= logged[0]["eval_rewards/accuracy_reward/mean"] <= 1
    own = method_metric(method)
    if own and method not in ("dph", "eepo"):  # DPH-RL's rehearsal and EEPO's gate act in training only
        assert f"eval_{own}" in logged[0], sorted(logged[0])
    late = data["test"].select(range(2, 6))
    if method == "erpo":  # no reference model after an update: the reference values come at construction
        with pytest.raises(ValueError, match="Pass the dataset as ERPOTrainer\\(eval_dataset=...\\)"):
            trainer.evaluate(eval_dataset=late)
    else:
        out = trainer.evaluate(eval_dataset=late)
        assert 0 <= out["eval_rewards/accuracy_reward/mean"] <= 1


def streaming(method, tmp_path):
    data = _dataset()["train"]
    trainer = make(method, tmp_path, dataset=data.to_iterable_dataset())
    train_changes_model(trainer)


def several_rewards(method, tmp_path):
    def level_reward(completions, level, **kwargs):  # reads an extra dataset column; None for every third
        assert len(level) == len(completions)
        return [None if i % 3 == 0 else 0.1 * lv for i, lv in enumerate(level)]

    trainer = make(method, tmp_path, reward_funcs=[*DENSE, level_reward], reward_weights=[1.0, 0.1, 0.5])
    train_changes_model(trainer)
    assert trainer.state.log_history[0]["rewards/level_reward/mean"] > 0


def async_reward(method, tmp_path):
    calls = []

    async def async_accuracy(completions, **kwargs):
        await asyncio.sleep(0)
        calls.append(len(completions))
        return accuracy_and_length(completions=completions, **kwargs)

    trainer = make(method, tmp_path, reward_funcs=[async_accuracy],
                   **({"correctness_reward": "async_accuracy", "correctness_threshold": 1.0} if method == "dph" else {}))
    train_changes_model(trainer)
    assert calls and "rewards/async_accuracy/mean" in trainer.state.log_history[0]


def reward_kwargs(method, tmp_path):
    states = []

    def watching_reward(completions, trainer_state, log_extra, log_metric, **kwargs):
        states.append(trainer_state)
        log_metric("watching/calls", 1.0)
        log_extra("watched", ["x"] * len(completions))
        return accuracy_and_length(completions=completions, **kwargs)

    trainer = make(method, tmp_path, reward_funcs=[watching_reward])
    assert all(s is trainer.state for s in states)  # the offline pass's calls (if any) saw the trainer's state
    train_changes_model(trainer)  # (transformers starts a new TrainerState in train())
    assert states and all(isinstance(s, TrainerState) for s in states) and states[-1] is trainer.state
    assert trainer.state.log_history[0]["watching/calls"] == 1.0


def reward_model(method, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = tiny_reward_model(tmp_path / "rm")
    rm = AutoModelForSequenceClassification.from_pretrained(path)
    trainer = make(method, tmp_path, reward_funcs=[*DENSE, rm], reward_weights=[1.0, 0.1, 0.1],
                   trainer_kwargs=dict(reward_processing_classes=[None, None, AutoTokenizer.from_pretrained(path)]))
    train_changes_model(trainer)


def generation_kwargs(method, tmp_path):
    """Beam search in the rollouts and in the offline pass (4 samples per prompt from 2 beams; transformers refuses
    more returned sequences than beams in one call)."""
    more = {"dph": dict(num_presamples=4, pef_threshold=4), "apo": dict(num_value_samples=4)}.get(method, {})
    trainer = make(method, tmp_path, generation_kwargs={"num_beams": 2, "do_sample": False}, **more)
    trainer.train()
    assert trainer.state.global_step == 1 and math.isfinite(trainer.state.log_history[0]["loss"])
    if method == "apo":
        assert all(len(r) == 4 for r in trainer.train_dataset["ref_rewards"])
    if method == "dph":
        assert trainer.split_stats["num_pef_prompts"] + trainer.split_stats["num_exp_prompts"] == 16


def chat_template_kwargs(method, tmp_path):
    from .helpers import hinted_tokenizer

    trainer = make(method, tmp_path, chat_template_kwargs={"system_hint": "Be brief."},
                   trainer_kwargs=dict(processing_class=hinted_tokenizer()))
    ids = trainer._tokenize_prompts([_dataset()["train"][0]["prompt"]])[0][0]
    assert "Be brief." in trainer.processing_class.decode(ids)
    train_changes_model(trainer)


def iterations(method, tmp_path):
    trainer = make(method, tmp_path, num_iterations=2, steps_per_generation=2, max_steps=2,
                   per_device_train_batch_size=8)
    train_changes_model(trainer)


def odd_group(method, tmp_path):
    # 48 tokens, not small_config's 24: at 24 a draw can clip all 12 completions (the length reward is then constant,
    # no advantage; DPH-RL's rehearsal has no gradient at its first step, u = 1), which DPH-RL's draw did once its
    # offline pass stopped consuming the global random stream
    trainer = make(method, tmp_path, num_generations=3, per_device_train_batch_size=12, max_completion_length=48)
    train_changes_model(trainer)


def mask_truncated(method, tmp_path):
    trainer = make(method, tmp_path, mask_truncated_completions=True, max_completion_length=12)
    train_changes_model(trainer)


def entropy_masking(method, tmp_path):
    trainer = make(method, tmp_path, top_entropy_quantile=0.5)
    train_changes_model(trainer)


def entropy_bonus(method, tmp_path):
    """The bonus acts: GRPO's loss path logs the coefficient it applied; A*-PO's regression logs its entropy term."""
    trainer = make(method, tmp_path, entropy_coef=0.01)
    train_changes_model(trainer)
    logged = trainer.state.log_history[0]
    if method == "apo":
        assert math.isfinite(logged["entropy"])
    else:
        assert logged["entropy_coef"] == pytest.approx(0.01) and "policy_loss" in logged


def adaptive_entropy_bonus(method, tmp_path):
    """The controller runs: after the step, the coefficient moved from its start by entropy_coef_delta."""
    trainer = make(method, tmp_path, use_adaptive_entropy=True, entropy_coef=0.01, entropy_coef_delta=0.005)
    train_changes_model(trainer)
    assert trainer.state.log_history[0]["entropy_coef"] in (pytest.approx(0.015), pytest.approx(0.005))


LOSS_TYPES = ["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"]


def loss_types(method, tmp_path):
    """One trainer per importance-sampling level, then every loss type's loss and gradients on the same rollouts:
    finite, and not all zero."""
    for level in ("token", "sequence"):
        trainer = None
        for loss_type in LOSS_TYPES:
            if loss_type == "luspo" and level == "token":
                continue  # TRL: luspo needs sequence-level ratios
            if method == "apo" and (loss_type, level) != ("dapo", "token"):
                make(method, tmp_path, loss_type=loss_type, importance_sampling_level=level)  # refused
            if trainer is None:
                trainer = make(method, tmp_path, importance_sampling_level=level, loss_type=loss_type)
                trainer.model.train()
                trainer._step = 0
                batch = trainer._prepare_inputs(trainer.get_train_dataloader().__iter__().__next__())
            trainer.loss_type = loss_type
            trainer.model.zero_grad(set_to_none=True)
            trainer.current_gradient_accumulation_steps = 1
            loss = trainer.compute_loss(trainer.model, batch)
            loss.backward()
            grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
            assert torch.isfinite(loss) and grads and any(g.abs().sum() > 0 for g in grads), (loss_type, level)


def kl_beta(method, tmp_path):
    trainer = make(method, tmp_path, beta=0.05)
    train_changes_model(trainer)
    assert "kl" in trainer.state.log_history[0] or method == "apo"


def peft(method, tmp_path):
    from peft import LoraConfig

    trainer = make(method, tmp_path, learning_rate=1e-2, trainer_kwargs=dict(
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")))
    train_changes_model(trainer)


def _tiny_model(tmp_path, kind):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    common = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=16, pad_token_id=tok.pad_token_id,
                  eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, tie_word_embeddings=True)
    if kind == "qwen3_moe":
        common.update(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.01,
                      decoder_sparse_step=1, mlp_only_layers=[])  # (router logits in generate: a transformers bug)
    config = AutoConfig.for_model(kind, **common)
    torch.manual_seed(0)
    path = tmp_path / kind
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def architecture(kind):
    def run(method, tmp_path):
        extra = {"dph": dict(correctness_reward="length_reward", correctness_threshold=1.2, require_pef=False)}
        trainer = make(method, tmp_path, model=_tiny_model(tmp_path, kind), reward_funcs=[length_reward],
                       learning_rate=1e-2, **extra.get(method, {}))
        train_changes_model(trainer)
        if kind == "qwen3_moe":
            assert trainer.aux_loss_enabled and trainer.state.log_history[0]["aux_loss"] > 0
    return run


# ------------------------------------------------------------------------------------ tools, environments ---
# The tiny default's chat template renders no tool calls, so TRL refuses tools with it. This one is ChatML plus tools,
# as TRL 1.16 checks a template (supports_tool_calling: the call's name and arguments and the tool's result all
# rendered; prefix-preserving): a system line naming the tools, a call as <tool_call> JSON </tool_call> (the format of
# TRL's qwen3 response template, which parses it back), a result as a 'tool' turn.
TOOL_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\ntools:' }}{% for tool in tools %}{{ ' ' + tool.function.name }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}{{ '<|im_start|>tool\\n' + message.content + '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + message.role + '\\n' + message.content }}"
    "{% for call in message.tool_calls or [] %}{{ '<tool_call>\\n' }}"
    "{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}{{ '\\n</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def tool_tokenizer():
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_template

    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    tok.chat_template = TOOL_TEMPLATE
    tok.response_template = qwen3_template  # TRL's parser of <tool_call> JSON (it sets one only for known templates)
    return tok


def forced_tool_call(tok, name: str) -> dict:
    """``generation_kwargs`` under which the first assistant turn calls tool ``name``: a random tiny model never would.
    ``sequence_bias`` adds 100 to each next token of the call, given the turn's opening after a user message ending in
    '?' and the call so far; the turn after the tool's result opens after the result, so it is sampled freely (and
    the group's completions differ there)."""
    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    opening = ids("?<|im_end|>\n<|im_start|>assistant\n")
    call = ids(f'<tool_call>\n{{"name": "{name}"}}\n</tool_call>') + [tok.eos_token_id]
    return {"sequence_bias": [[opening + call[: j + 1], 100.0] for j in range(len(call))]}


def last_turn_length(completions, **kwargs):
    """The last message's length / 20: after a tool call, the freely sampled turn that follows the tool's result."""
    return [len(c[-1]["content"]) / 20 for c in completions]


def tool_run(method, tmp_path, *, reward_funcs, dataset=DEFAULT_DATASET, **trainer_kwargs):
    """One step with the tool template and the call to ``ping`` forced (a function in ``tools=``, or the method of an
    ``environment_factory``'s environments): the call was parsed and run, and the weights changed. 72 tokens hold
    the call, the tool's result and a few tokens of the next turn."""
    tok = tool_tokenizer()
    trainer = make(method, tmp_path, reward_funcs=reward_funcs, dataset=dataset, per_device_train_batch_size=8,
                   max_completion_length=72, max_tool_calling_iterations=1,
                   generation_kwargs=forced_tool_call(tok, "ping"),
                   trainer_kwargs=dict(processing_class=tok, **trainer_kwargs))
    batches, generate_and_score = [], trainer._generate_and_score_completions

    def watched(inputs):
        batches.append(generate_and_score(inputs))
        return batches[-1]

    trainer._generate_and_score_completions = watched
    train_changes_model(trainer)
    logged = trainer.state.log_history[0]
    assert logged["tools/call_frequency"] > 0
    assert (batches[0]["tool_mask"] == 0).any()  # the tool's result is in the completion, masked out of the loss
    if method == "erpo":  # its reference pass scored the prompts GRPO generates from (tools, the env's observation)
        assert logged["erpo/query_kl"] == 0.0
    return trainer


def ping() -> str:
    """Ping the checker.

    Returns:
        The word pong.
    """
    PINGS.append(1)
    return "pong"


PINGS: list[int] = []


def with_tools(method, tmp_path):
    PINGS.clear()
    tool_run(method, tmp_path, reward_funcs=[accuracy_reward, last_turn_length], tools=[ping])
    assert PINGS  # the call was parsed and the function run


class PingEnv:
    """An environment (TRL's environment_factory): reset(**row) returns an observation, from the row's columns, that
    TRL appends to the row's prompt; one tool method, ``ping``; state a reward function reads (``environments``, one
    instance per rollout)."""

    def __init__(self):
        self.pings = 0

    def reset(self, **row) -> str:
        self.pings = 0
        return f" Level {row['level']}: ping first?"

    def ping(self) -> str:
        """Ping the environment.

        Returns:
            The word pong.
        """
        self.pings += 1
        return "pong"


def environment_reward(completions, environments, **kwargs):
    """The environment's state (how often its tool ran) plus the free turn's length."""
    assert len(environments) == len(completions)
    return [env.pings + len(c[-1]["content"]) / 20 for env, c in zip(environments, completions, strict=True)]


def with_environment(method, tmp_path):
    trainer = tool_run(method, tmp_path, reward_funcs=[accuracy_reward, environment_reward],
                       environment_factory=PingEnv)
    assert trainer.state.log_history[0]["rewards/environment_reward/mean"] >= 1  # every rollout pinged its own env


class TaskEnv(PingEnv):
    """An environment that owns the data: each reset() makes the next task (TRL then needs no train_dataset)."""

    made = 0

    def reset(self, **row) -> str:
        self.pings = 0
        TaskEnv.made += 1
        return f"What is {TaskEnv.made % 7} + 2?"


def environment_owns_data(method, tmp_path):
    tool_run(method, tmp_path, reward_funcs=[environment_reward], dataset=None, environment_factory=TaskEnv)


BEHAVIOURS = dict(zip(EXPECTED, [eval_dataset, streaming, several_rewards, async_reward, reward_kwargs, reward_model,
                                 generation_kwargs, chat_template_kwargs, iterations, odd_group, mask_truncated,
                                 entropy_masking, entropy_bonus, adaptive_entropy_bonus, loss_types, kl_beta, peft, architecture("qwen2"),
                                 architecture("qwen3_moe"), with_tools, with_environment, environment_owns_data],
                      strict=True))


def trl_cannot_run(behaviour: str) -> str | None:
    """Why TRL 1.16 itself (its GRPOTrainer too) cannot run ``behaviour`` with the installed transformers, or None."""
    import importlib.util

    import transformers
    from packaging.version import Version

    version = Version(transformers.__version__)
    if behaviour.startswith("environment_factory") and version < Version("5.2"):
        return f"TRL 1.16's environment_factory needs transformers >= 5.2 (this is {version})"
    # an environment's methods are tools to TRL (found under transformers 5.10: TRL's jmespath ImportError)
    if behaviour.startswith(("tools", "environment_factory")) and version < Version("5.13") \
            and importlib.util.find_spec("jmespath") is None:
        return f"TRL 1.16's tool calling needs transformers >= 5.13 or the jmespath package (this is {version})"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("behaviour", list(EXPECTED))
def test_dropin(behaviour, method, tmp_path):
    expected = EXPECTED[behaviour][method]
    try:
        if expected == WORKS:
            BEHAVIOURS[behaviour](method, tmp_path)
        else:  # refused at construction, naming why
            with pytest.raises(ValueError, match=re.escape(expected)):
                BEHAVIOURS[behaviour](method, tmp_path)
    except ImportError:  # TRL's own refusal, where it comes before the behaviour (or ours) is reached
        if trl_cannot_run(behaviour):
            pytest.skip(trl_cannot_run(behaviour))
        raise


def readme_table() -> str:
    names = {"grpo": "GRPOTrainer", "erpo": "ERPO", "eepo": "EEPO", "dph": "DPH-RL", "apo": "A*-PO"}
    lines = ["| behaviour | " + " | ".join(names[m] for m in METHODS) + " |", "|---" * (len(METHODS) + 1) + "|"]
    for behaviour, cells in EXPECTED.items():
        shown = ["works" if cells[m] == WORKS else f"refused: {cells[m]}" for m in METHODS]
        lines.append(f"| {behaviour} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def test_readme_table_matches():
    readme = (Path(__file__).resolve().parent.parent / "docs" / "trainers.md").read_text()  # the matrix's page
    assert readme_table() in readme, "README's drop-in table differs from EXPECTED; paste:\n" + readme_table()


if __name__ == "__main__":  # print the README table
    print(readme_table())
