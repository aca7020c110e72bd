"""The embedded default: a ~1M-parameter Llama model, its character-level tokenizer and a synthetic math task,
all shipped inside the package so that examples and tests run offline.

>>> from transformers import AutoModelForCausalLM
>>> from trl_variants.default import DEFAULT_MODEL_PATH, load_default_dataset
>>> model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH)
>>> ds = load_default_dataset()            # DatasetDict(train, test): prompt / solution / level
"""

from __future__ import annotations

from pathlib import Path

from datasets import Dataset, DatasetDict

from .task import LEVELS, Problem, generate_problem, generate_problems
from .tokenizer import build_tokenizer, check_character_level

DEFAULT_MODEL_PATH = str(Path(__file__).resolve().parent / "assets")
"""Directory of the shipped model + tokenizer; pass it as ``model=`` to any trainer or to ``from_pretrained``."""

TEST_SEED = 999


def default_model_path() -> str:
    """Path of the shipped tiny model (same as :data:`DEFAULT_MODEL_PATH`)."""
    return DEFAULT_MODEL_PATH


def problems_to_dataset(problems: list[Problem], with_reference: bool = False) -> Dataset:
    """Conversational ``prompt``, gold ``solution`` (string) and ``level`` columns; ``completion`` (the reference
    reasoning) too when ``with_reference``."""
    cols = {
        "prompt": [[{"role": "user", "content": p.question}] for p in problems],
        "solution": [str(p.answer) for p in problems],
        "level": [p.level for p in problems],
    }
    if with_reference:
        cols["completion"] = [[{"role": "assistant", "content": p.completion}] for p in problems]
    return Dataset.from_dict(cols)


def load_default_dataset(
    n_train: int = 2000,
    n_test: int = 500,
    seed: int = 0,
    levels: tuple[int, ...] = LEVELS,
    weights: tuple[float, ...] | None = None,
    with_reference: bool = False,
) -> DatasetDict:
    """The synthetic math task as train / test splits, deterministic in ``seed``.

    The test split is always drawn with seed 999 over all levels (uniform), so held-out numbers are comparable
    across runs; training questions that also occur in the test split are skipped.
    """
    test = generate_problems(n_test, TEST_SEED)
    held_out = {p.question for p in test}
    train: list[Problem] = []
    draw = 0
    while len(train) < n_train:
        batch = generate_problems(n_train, seed * 1_000_003 + draw, levels, weights)
        train.extend(p for p in batch if p.question not in held_out)
        draw += 1
    return DatasetDict(
        train=problems_to_dataset(train[:n_train], with_reference),
        test=problems_to_dataset(test, with_reference),
    )


__all__ = [
    "DEFAULT_MODEL_PATH", "LEVELS", "Problem", "build_tokenizer", "check_character_level", "default_model_path",
    "generate_problem", "generate_problems", "load_default_dataset", "problems_to_dataset",
]


def measure_accuracy(
    model, tokenizer, dataset: Dataset, *, do_sample: bool, temperature: float = 1.0, max_new_tokens: int = 64,
    seed: int = 0, batch_size: int = 128,
) -> dict[str, float]:
    """Accuracy of ``model`` on ``dataset`` (prompt / solution / level columns), overall and per level, with one
    completion per prompt (greedy, or sampled at ``temperature`` with top_p = 1, top_k = 0)."""
    import torch

    from ..generation import generate_completions, tokenize_prompts
    from ..rewards import accuracy_reward

    torch.manual_seed(seed)
    ids = tokenize_prompts(tokenizer, dataset["prompt"])
    comps = generate_completions(
        model, tokenizer, ids, 1, max_new_tokens=max_new_tokens, temperature=temperature, do_sample=do_sample,
        batch_size=batch_size,
    )
    texts = tokenizer.batch_decode([c[0] for c in comps], skip_special_tokens=True)
    scores = accuracy_reward(texts, dataset["solution"])
    result = {"overall": sum(scores) / len(scores)}
    for level in sorted(set(dataset["level"])):
        s = [x for x, lv in zip(scores, dataset["level"], strict=True) if lv == level]
        result[f"level_{level}"] = sum(s) / len(s)
    return result
