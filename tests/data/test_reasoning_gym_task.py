"""reasoning-gym tasks (data.task=reasoning_gym:<name>): its own scorer as the reward, checked against answers made
by hand from the question; held-out and training splits that share no question; prompts as reasoning-gym means
them (its system prompt and question, through the chat template); clear errors for bad settings."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("reasoning_gym")

from helpers.tiny_hf import chat_tokenizer  # noqa: E402

from grpo.config import load_config  # noqa: E402
from grpo.data import task_from_config  # noqa: E402
from grpo.data.reasoning_gym import ReasoningGymTask  # noqa: E402
from grpo.errors import ConfigError  # noqa: E402

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-", "*"],
         "allow_parentheses": False, "allow_negation": False}


def hand_value(question: str) -> int:
    """'Calculate 7 * 3 - 2.' -> 19, by a left-to-right reading with * first (no eval)."""
    expr = re.search(r"Calculate (.*)\.$", question.strip()).group(1)
    tokens = expr.split()
    terms, ops = [int(tokens[0])], []
    for op, num in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            terms[-1] *= int(num)
        else:
            ops.append(op)
            terms.append(int(num))
    total = terms[0]
    for op, t in zip(ops, terms[1:]):
        total = total + t if op == "+" else total - t
    return total


def task(**kw) -> ReasoningGymTask:
    kw.setdefault("options", SMALL)
    kw.setdefault("test_size", 40)
    return ReasoningGymTask("basic_arithmetic", tokenizer=kw.pop("tokenizer", chat_tokenizer()), **kw)


def test_the_reward_is_reasoning_gyms_scorer_on_hand_made_right_and_wrong_answers():
    t = task()
    prompts = t.split("train", 12)
    (name, fn, weight), = t.reward_functions()
    assert (name, weight) == ("reasoning_gym", 1.0)
    for p in prompts:
        question = t.entry("train", p.meta["rg_index"])["question"]
        right = hand_value(question)
        assert p.answer == str(right)
        completions = [f"<think>easy</think> <answer>{right}</answer>",   # right, in reasoning-gym's tags
                       f"<answer>{right + 1}</answer>",                     # wrong
                       f"{right}",                                          # right but not in the tags
                       f"<answer>{right + 7}</answer> then <answer>{right}</answer>"]  # the last tag counts
        cols = {"rg_split": [p.meta["rg_split"]] * 4, "rg_index": [p.meta["rg_index"]] * 4}
        assert fn([p.text] * 4, completions, **cols) == [1.0, 0.0, 0.0, 1.0]
        assert t.is_correct(p, completions[0]) and not t.is_correct(p, completions[1])


def test_held_out_and_training_questions_never_overlap_even_in_a_small_space():
    import reasoning_gym

    t = task(test_size=60)
    train, test = t.split("train", 1000), t.split("test", 60)
    q = lambda ps, t=t: [t.entry(p.meta["rg_split"], p.meta["rg_index"])["question"] for p in ps]  # noqa: E731
    q_train, q_test = q(train), q(test)
    assert len(set(q_test)) == 60 and len(set(q_train)) == len(q_train)  # distinct within each split
    assert not set(q_train) & set(q_test)
    # a space of a few hundred questions: asking for 1000 exhausts it, and training gets all of it but the
    # held-out pool (the space counted here straight from the generator, over seeds far apart: an entry is drawn
    # from Random(seed + index), so nearby seeds repeat each other)
    space = {reasoning_gym.create_dataset("basic_arithmetic", seed=s * 10_000_019, size=500, **SMALL)[i]["question"]
             for s in range(40) for i in range(500)}
    assert set(q_train) | set(q_test) == space and len(q_train) == len(space) - 60
    again = task(test_size=60)
    assert [p.text for p in again.split("train", 100)] == [p.text for p in train[:100]]  # fixed, prefix-stable
    assert [p.uid for p in train[:3]] == ["train-0", "train-1", "train-2"]
    other = task(test_size=60, seed=1)
    assert q(other.split("test", 60), other) != q_test  # data.task_seed changes the draw


def test_prompts_are_its_system_prompt_and_question_through_the_chat_template():
    import reasoning_gym.utils

    tok = chat_tokenizer()
    t = task(tokenizer=tok, system_prompt="default")
    p = t.split("train", 1)[0]
    q = t.entry("train", 0)["question"]
    assert p.templated
    system = reasoning_gym.utils.SYSTEM_PROMPTS["default"]
    assert p.text == tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": q}],
                                             tokenize=False, add_generation_prompt=True)
    plain = task(tokenizer=None, system_prompt=None).split("train", 1)[0]  # no chat template: the question as is
    assert not plain.templated and plain.text == q + "\n"


def test_config_routes_and_errors(tmp_path):
    cfg = load_config(None, ["data.task=reasoning_gym:basic_arithmetic", f"model.name={tmp_path}",
                             "data.task_options={min_terms: 2, max_terms: 2}", "data.task_seed=3",
                             "data.test_size=20", "data.task_system_prompt=direct"])
    t = task_from_config(cfg, tokenizer=chat_tokenizer())
    assert isinstance(t, ReasoningGymTask) and t.seed == 3 and t.test_size == 20 and "<answer>" in t.system_prompt
    builtin = load_config(None, ["data.task=reasoning_gym:basic_arithmetic"])
    with pytest.raises(ConfigError, match="built-in model"):
        task_from_config(builtin)
    with pytest.raises(ConfigError, match="basic_arithmetic"):  # a near miss is suggested
        ReasoningGymTask("basic_arithmetc")
    with pytest.raises(ConfigError, match="data.task_options"):
        ReasoningGymTask("basic_arithmetic", options={"min_terms": 3, "max_terms": 2})
    with pytest.raises(ConfigError, match="data.task_seed"):
        ReasoningGymTask("basic_arithmetic", options={"seed": 1})
    with pytest.raises(ConfigError, match="data.test_size"):
        task(test_size=5).split("test", 6)
    tiny = {**SMALL, "operators": ["+"]}  # 100 questions at most
    with pytest.raises(ConfigError, match="distinct held-out questions"):
        task(options=tiny, test_size=300).split("test", 300)
