import random
import re

from trl_variants.default import generate_problems, load_default_dataset
from trl_variants.default.task import generate_problem


def _eval_reference(completion: str) -> int:
    """Re-check every 'a + b = c' step of the reference completion with Python arithmetic, and the chaining."""
    steps = re.findall(r"(\d+) \+ (\d+) = (\d+)", completion)
    assert steps, completion
    for i, (a, b, c) in enumerate(steps):
        assert int(a) + int(b) == int(c), completion
        if i:
            assert int(a) == int(steps[i - 1][2]), completion  # each step continues from the last total
    return int(re.search(r"\\boxed\{(\d+)\}", completion).group(1))


def test_answers_are_correct_for_every_level():
    rng = random.Random(0)
    for level in (1, 2, 3, 4):
        for _ in range(200):
            p = generate_problem(rng, level)
            assert p.level == level
            digits = [int(n) for n in re.findall(r"\d+", p.question)]
            assert len(digits) == level + 1 and all(1 <= d <= 9 for d in digits)
            assert _eval_reference(p.completion) == p.answer == sum(digits)
            assert p.completion.count(" = ") == level  # one step per addition
            assert p.direct == f"\\boxed{{{p.answer}}}"


def test_generation_is_deterministic_in_seed():
    assert generate_problems(50, seed=3) == generate_problems(50, seed=3)
    assert generate_problems(50, seed=3) != generate_problems(50, seed=4)


def test_dataset_columns_splits_and_disjointness():
    ds = load_default_dataset(n_train=300, n_test=100, seed=1)
    assert ds["train"].num_rows == 300 and ds["test"].num_rows == 100
    assert set(ds["train"].column_names) == {"prompt", "solution", "level"}
    row = ds["train"][0]
    assert row["prompt"][0]["role"] == "user" and isinstance(row["solution"], str)
    train_q = {r[0]["content"] for r in ds["train"]["prompt"]}
    test_q = {r[0]["content"] for r in ds["test"]["prompt"]}
    assert not train_q & test_q
    assert sorted(set(ds["test"]["level"])) == [1, 2, 3, 4]
    # same seed, same data; the test split does not depend on the training seed
    again = load_default_dataset(n_train=300, n_test=100, seed=1)
    assert again["train"]["prompt"] == ds["train"]["prompt"]
    assert load_default_dataset(n_train=10, n_test=100, seed=2)["test"]["prompt"] == ds["test"]["prompt"]


def test_level_weights_and_reference_column():
    ds = load_default_dataset(n_train=200, n_test=10, levels=(1, 4), weights=(1.0, 0.0), with_reference=True)
    assert set(ds["train"]["level"]) == {1}
    assert ds["train"][0]["completion"][0]["content"].endswith("}")


def test_levels_beyond_training_exist_for_held_out_studies_only():
    """Levels 5 and 6 (BEYOND_LEVELS) can be generated one problem at a time; the splits never draw them."""
    import pytest

    from trl_variants.default.task import BEYOND_LEVELS, LEVELS

    rng = random.Random(1)
    for level in BEYOND_LEVELS:
        p = generate_problem(rng, level)
        assert p.level == level and _eval_reference(p.completion) == p.answer
        assert p.completion.count(" = ") == level
    with pytest.raises(ValueError, match=r"level must be one of \(1, 2, 3, 4, 5, 6\), got 7"):
        generate_problem(rng, 7)
    assert set(load_default_dataset(n_train=200, n_test=50)["train"]["level"]) <= set(LEVELS)
