"""Built-in reward functions and the registry."""

from __future__ import annotations

import re

import pytest

from grpo.rewards import (
    REWARD_FUNCTIONS,
    RewardRunner,
    RewardSpec,
    UnknownRewardFunction,
    completion_text,
    countdown,
    exact_answer,
    format_tags,
    get_reward_function,
    register_reward,
)
from grpo.rewards.answers import last_boxed, to_number

BUILTINS = {
    "exact_answer",
    "math_verify",
    "format_tags",
    "regex_format",
    "overlong",
    "code_tests",
    "countdown",
    "reward_model",
}


def test_registry_names_and_errors():
    assert BUILTINS <= set(REWARD_FUNCTIONS)
    with pytest.raises(ValueError, match="unknown reward function 'nope'; known: .*exact_answer"):
        get_reward_function("nope")
    with pytest.raises(KeyError):
        get_reward_function("nope")
    assert issubclass(UnknownRewardFunction, ValueError)
    with pytest.raises(ValueError, match="regex_format"):
        get_reward_function("regex_format")  # a factory without its required option
    with pytest.raises(ValueError, match="no option"):
        get_reward_function("exact_answer", bogus=1)


def test_options_bind_and_keep_name_and_attributes():
    fn = get_reward_function("code_tests", timeout=3.0, partial=True)
    assert fn.__name__ == "code_tests" and fn.in_process and fn.keywords == {"timeout": 3.0, "partial": True}
    rx = get_reward_function("regex_format", pattern=r"\d+")
    assert rx(None, ["123", "x1"]) == [1.0, 0.0]
    assert get_reward_function("exact_answer") is exact_answer


def test_register_custom_reward():
    @register_reward("test_custom_len")
    def custom(prompts, completions, **kw):
        return [float(len(c)) for c in completions]

    assert get_reward_function("test_custom_len")(None, ["ab"]) == [2.0]
    with pytest.raises(ValueError, match="already registered"):
        register_reward("test_custom_len", lambda prompts, completions, **kw: [])
    del REWARD_FUNCTIONS["test_custom_len"]


def test_completion_text():
    assert completion_text("x") == "x"
    conv = [
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "t"},
        {"role": "assistant", "content": "b"},
    ]
    assert completion_text(conv) == "a\nb"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "hi"}]}]) == "hi"


@pytest.mark.parametrize(
    "completion, answer, want",
    [
        ("The answer is \\boxed{42}.", "42", 1.0),
        ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),
        ("<answer> 1,234 </answer>", "1234", 1.0),
        ("<answer>The result is 17.</answer>", "17", 1.0),
        ("I got 5 then 7", "7", 1.0),
        ("I got 7 then 5", "7", 0.0),
        ("no number here", "7", 0.0),
        ("Janet makes $18 a day", "Natalia ... #### 18", 1.0),
        ("<answer>Paris</answer>", "paris", 1.0),
        ("<answer>London</answer>", "Paris", 0.0),
        ("\\boxed{-2}", "-2", 1.0),
        ("\\boxed{2}", "-2", 0.0),
        ("anything", None, None),
    ],
)
def test_exact_answer(completion, answer, want):
    assert exact_answer(None, [completion], answer=[answer]) == [want]


def test_answer_helpers():
    assert last_boxed("a \\boxed{x^{2}} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{unclosed") is None
    assert to_number("\\frac{1}{2}") == to_number("0.5") == to_number("1/2")
    assert to_number("abc") is None and to_number("1/0") is None


def test_exact_answer_conversational():
    conv = [{"role": "assistant", "content": "<answer>9</answer>"}]
    assert exact_answer(None, [conv], answer=["9"]) == [1.0]


def test_format_tags():
    good = "<think>\nsteps\n</think>\n<answer>4</answer>"
    bad = [
        "<answer>4</answer>",
        "<think>x</think>",
        "text <think>x</think><answer>4</answer>",
        "<think>x</think><answer>4</answer><answer>5</answer>",
    ]
    assert format_tags(None, [good, *bad]) == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_regex_format_search_and_fullmatch():
    search = get_reward_function("regex_format", pattern=r"<answer>\s*-?\d+\s*</answer>", full=False)
    assert search(None, ["xx <answer> -3 </answer> yy", "<answer>x</answer>"]) == [1.0, 0.0]
    full = get_reward_function("regex_format", pattern=r"\d+", flags=re.IGNORECASE)
    assert full(None, ["12", "12a"]) == [1.0, 0.0]


def test_overlong_shaping():
    fn = get_reward_function("overlong", max_len=100, cache_len=20)
    # TRL's test vector: 90 tokens of 100 with a cache of 20 gives -0.5.
    assert fn(None, ["x"] * 4, completion_lengths=[50, 80, 90, 101]) == [0.0, 0.0, -0.5, -1.0]
    assert fn(None, ["x"] * 2, completion_ids=[[1] * 90, [1] * 10]) == [-0.5, 0.0]
    assert fn(None, ["y" * 90]) == [-0.5]  # characters when no lengths are given
    with pytest.raises(ValueError, match="cache_len"):
        get_reward_function("overlong", max_len=10, cache_len=20)


@pytest.mark.parametrize(
    "completion, numbers, target, want",
    [
        ("<answer>(3 + 4) * 5</answer>", [3, 4, 5], 35, 1.0),
        ("<think>hmm</think>\n<answer>5 * 7 = 35</answer>", [5, 7, 2], 35, 1.0),
        ("(3 + 4) * 5", [3, 4, 5], 35, 1.0),  # last line when there are no tags
        ("<answer>12 / 4 + 1</answer>", [12, 4, 1], 4, 1.0),
        ("<answer>7 / 2 * 2</answer>", [7, 2, 2], 7, 1.0),  # exact rationals
        ("<answer>5 * 5 + 10</answer>", [5, 10, 3], 35, 0.0),  # 5 used twice
        ("<answer>6 * 6</answer>", [3, 4, 5], 36, 0.0),  # a number not given
        ("<answer>3 + 4</answer>", [3, 4, 5], 7, 1.0),
        ("<answer>1 / 0</answer>", [1, 0], 1, 0.0),
        ("<answer>2 ** 5</answer>", [2, 5], 32, 0.0),  # only + - * /
        ("<answer>-3 + 10</answer>", [3, 10], 7, 0.0),  # no unary minus
        ("<answer>__import__('os').system('true')</answer>", [1], 0, 0.0),
        ("<answer>(1+" + "(1+" * 300 + "1" + ")" * 301 + "</answer>", [1] * 302, 302, 0.0),
        ("<answer>2.5 * 2</answer>", [2, 5], 5, 0.0),
        ("anything", None, 3, None),
    ],
)
def test_countdown(completion, numbers, target, want):
    assert countdown(None, [completion], numbers=[numbers], target=[target]) == [want]


def test_countdown_require_all():
    fn = get_reward_function("countdown", require_all=True)
    assert fn(
        None, ["<answer>3 + 4</answer>", "<answer>3 + 4 - 5</answer>"], numbers=[[3, 4, 5]] * 2, target=[7, 2]
    ) == [0.0, 1.0]


# ---------------------------------------------------------------------------------------------------- math-verify


@pytest.mark.parametrize("in_process", [False, True])
def test_math_verify_runs_off_the_main_thread(in_process):
    pytest.importorskip("math_verify")
    fn = get_reward_function("math_verify")
    completions = [
        "So the result is $\\frac{1}{2}$.",
        "\\boxed{0.5}",
        "<answer>\\sqrt{4}</answer>",
        "<answer>3</answer>",
        "The answer is \\boxed{\\{1, 2\\}}",
        "no answer at all",
        "whatever",
    ]
    answers = ["1/2", "\\frac12", "2", "4", "\\{2, 1\\}", "7", None]
    with RewardRunner([RewardSpec("math", fn, in_process=in_process)], timeout_s=30.0) as runner:
        res = runner(["q"] * len(completions), completions, {"answer": answers})
    assert res.status["math"] == ["ok"] * 6 + ["none"]
    assert res.per_function["math"].tolist()[:6] == [1.0, 1.0, 1.0, 0.0, 1.0, 0.0]


def test_math_verify_missing_dependency_message(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else real(name, *a))
    with pytest.raises(ImportError, match=r"grpo\[math\]"):
        get_reward_function("math_verify")
