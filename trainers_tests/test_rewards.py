import pytest

from trl_variants.rewards import accuracy_reward, format_reward, last_boxed


@pytest.mark.parametrize(
    "text,gold,expected",
    [
        ("4 + 7 = 11. \\boxed{11}", "11", 1.0),
        ("4 + 7 = 12. \\boxed{12}", "11", 0.0),
        ("\\boxed{11.0}", "11", 1.0),  # math-verify equivalence
        ("\\boxed{\\frac{22}{2}}", "11", 1.0),
        ("first \\boxed{3} then \\boxed{11}", "11", 1.0),  # the LAST boxed answer counts
        ("first \\boxed{11} then \\boxed{3}", "11", 0.0),
        ("The answer is 11", "11", 0.0),  # no \boxed{}: no fallback to the last number
        ("\\boxed{", "11", 0.0),  # malformed
        ("\\boxed{}", "11", 0.0),
        ("", "11", 0.0),
        ("\\boxed{11}", "\\boxed{11}", 1.0),  # gold given as LaTeX
    ],
)
def test_accuracy_reward_plain(text, gold, expected):
    assert accuracy_reward([text], [gold]) == [expected]


def test_accuracy_reward_conversational_and_garbage():
    completions = [
        [{"role": "assistant", "content": "2 + 2 = 4. \\boxed{4}"}],
        [{"role": "assistant", "content": "\\boxed{5}"}],
        [{"role": "assistant", "content": None}],  # malformed message: scores 0, never raises
        None,
        [],
    ]
    assert accuracy_reward(completions, ["4"] * 5) == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_accuracy_reward_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="2 completions but 1 solutions"):
        accuracy_reward(["a", "b"], ["1"])


def test_last_boxed_nested_and_unbalanced():
    assert last_boxed("x \\boxed{\\frac{1}{2}} y") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{7} and \\boxed{8") == "7"
    assert last_boxed("none") is None


def test_format_reward():
    assert format_reward(["1 + 1 = 2. \\boxed{2}", "\\boxed{2} \\boxed{2}", "2", "\\boxed{2} extra"]) == [
        1.0, 0.0, 0.0, 0.0,
    ]


def test_accuracy_reward_is_fast():
    # Not a timing assertion: checks the gold parse cache is used (one entry per distinct gold).
    from trl_variants.rewards import _parse_gold

    _parse_gold.cache_clear()
    accuracy_reward(["\\boxed{3}"] * 50, ["3"] * 50)
    assert _parse_gold.cache_info().misses == 1


@pytest.mark.parametrize("text", [
    "\\boxed{\\frac{1}{2}}",  # nested braces
    "So x = 1/2. \\boxed{\\frac{1}{2}}",
    "\\frac{a}{b} = 3, so \\boxed{7}",  # a command before the box
    "Since \\sqrt{16} = 4 and \\frac{6}{2} = 3, \\boxed{\\sqrt{2}^{\\frac{1}{2}}}",
    "The answer is $\\boxed{7}$",  # math delimiters around the box
    "The answer is\n\\[\n\\boxed{\\{1, 2\\}}\n\\]",
    [{"role": "assistant", "content": "\\boxed{\\dfrac{3}{4}}"}],
])
def test_format_reward_accepts_valid_latex(text):
    assert format_reward([text]) == [1.0]


@pytest.mark.parametrize("text", [
    "\\boxed{\\frac{1}{2}",  # unbalanced
    "\\boxed{\\frac{1}{2}}}",  # a brace the box does not open
    "\\boxed{\\frac{1}{2}} \\boxed{3}",  # two boxes
    "\\frac{1}{2} \\boxed{\\boxed{3}}",
    "\\boxed{\\frac{1}{2}} then more text",
    "\\boxed{ }",  # an empty answer (accuracy_reward scores it 0 too)
    "$\\boxed{7}$ extra",
    "\\boxed{7}\\frac{1}{2}",
    None,
])
def test_format_reward_rejects(text):
    assert format_reward([text]) == [0.0]


@pytest.mark.parametrize("text,gold,expected", [
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
    ("\\frac{2}{4} = \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", 0.0),
    ("\\boxed{\\sqrt{\\frac{1}{4}}}", "\\frac{1}{2}", 1.0),
    ("\\boxed{2^{\\frac{1}{2}}}", "\\sqrt{2}", 1.0),
    ("\\boxed{\\frac{1}{2}}", "so $x=\\boxed{\\frac{1}{2}}$", 1.0),  # nested braces in a boxed gold
])
def test_accuracy_reward_nested_braces(text, gold, expected):
    assert accuracy_reward([text], [gold]) == [expected]
