"""grpo.rewards.specs: the one rule the trainer, a data file's task and the reward runner use to name a reward."""

from __future__ import annotations

import re

import pytest

from grpo.errors import ConfigError
from grpo.rewards import RewardRunner, exact_answer
from grpo.rewards.specs import reward_spec, reward_specs


def judge(prompts, completions, **kw):
    return [1.0] * len(completions)


class Scorer:  # a callable instance has no __name__: named by its class
    def __call__(self, prompts, completions, **kw):
        return [0.0] * len(completions)


def test_each_accepted_form():
    scorer = Scorer()
    assert reward_spec(judge) == ("judge", judge, 1.0)
    assert reward_spec(scorer) == ("Scorer", scorer, 1.0)
    assert reward_spec(("j", judge)) == ("j", judge, 1.0)
    assert reward_spec(["j", judge, 2]) == ("j", judge, 2.0)
    assert reward_spec(("j", judge, 0.5, {"timeout_s": 3.0})) == ("j", judge, 0.5, {"timeout_s": 3.0})
    name, fn, weight = reward_spec("exact_answer")
    assert (name, weight) == ("exact_answer", 1.0) and fn([""], ["42"], answer=["42"]) == exact_answer([""], ["42"],
                                                                                                      answer=["42"])
    assert [s[0] for s in reward_specs([judge, ("k", judge, 3.0)])] == ["judge", "k"]


@pytest.mark.parametrize(("entry", "message"), [
    (("j", 3.0), "reward function 'j' is not callable"),
    (("j", judge, float("inf")), "reward function 'j' has a non-finite weight inf"),
    (("j", judge, 1.0, {"bogus": 1}), "unknown reward option(s) ['bogus'] for 'j'"),
    (("j",), "expected a reward name, a function, or (name, fn[, weight[, options]])"),
    (42, "expected a reward name"),
])
def test_a_bad_entry_is_a_config_error_naming_it(entry, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        reward_spec(entry)


def test_the_runner_takes_the_same_forms():
    with RewardRunner([("j", judge), ("s", Scorer(), 2.0, {"in_process": True})]) as runner:
        assert [(s.name, s.weight, s.in_process) for s in runner.specs][1] == ("s", 2.0, True)
        assert runner.specs[0].name == "j" and runner.specs[0].weight == 1.0
