"""The built-in arithmetic task: disjoint splits, stable order, rewards, demonstrations."""

import random

import pytest

from grpo.data import get_task
from grpo.data.arithmetic import LEVELS, correct_reward, format_reward, last_integer, worked_solution


@pytest.mark.parametrize("difficulty", sorted(LEVELS))
def test_train_and_test_never_overlap(difficulty):
    task = get_task("arithmetic", difficulty=difficulty)
    n_test = 150 if difficulty == "easy" else 500
    train = task.split("train", 20000)
    test = task.split("test", n_test)
    assert len(test) == n_test and len({p.text for p in test}) == n_test
    assert not {p.text for p in train} & {p.text for p in test}
    assert len({p.uid for p in train} | {p.uid for p in test}) == len(train) + len(test)


def test_splits_are_stable_and_prefix_consistent():
    a = get_task("arithmetic").split("test", 100)
    b = get_task("arithmetic").split("test", 500)
    assert [p.text for p in a] == [p.text for p in b[:100]]


def test_answers_are_right():
    for p in get_task("arithmetic", difficulty="hard").split("train", 300):
        m = p.meta
        expected = {"+": m["a"] + m["b"], "-": m["a"] - m["b"], "×": m["a"] * m["b"]}[m["op"]]
        assert int(p.answer) == expected
        assert p.text == f"What is {m['a']} {m['op']} {m['b']}?\n"


def test_rewards():
    assert correct_reward(None, ["13 × 17 = 221", "13 × 17 = 230", "Let me think... 221"], ["221"] * 3) == [1, 0, 1]
    assert format_reward(None, ["13 × 17 = 221", "Let me think... 221", "47 + 38 = 70 + 15 = 85", "85"]) == [1, 0, 1, 0]
    # conversational completions (TRL style) are read from the last message
    assert correct_reward(None, [[{"role": "assistant", "content": "2 + 2 = 4"}]], ["4"]) == [1.0]
    assert last_integer("no digits") is None


def test_worked_solution_is_correct_and_formatted():
    for a in range(0, 100, 7):
        for b in range(0, 100, 11):
            for op in "+-":
                x, y = (max(a, b), min(a, b)) if op == "-" else (a, b)
                text = worked_solution(x, op, y)
                ans = x + y if op == "+" else x - y
                assert last_integer(text) == ans and format_reward(None, [text]) == [1.0], text


def test_demonstrations_mix_styles():
    task = get_task("arithmetic")
    rng = random.Random(0)
    demos = [task.demonstration(p, rng) for p in task.split("train", 400)]
    worked = sum(d[0].isdigit() for d in demos) / len(demos)
    assert 0.2 < worked < 0.5
    assert all(task.is_correct(p, d) for p, d in zip(task.split("train", 400), demos))


def test_unknown_task_and_difficulty():
    with pytest.raises(ValueError, match="data.task"):
        get_task("nope")
    with pytest.raises(ValueError, match="data.difficulty"):
        get_task("arithmetic", difficulty="impossible")
