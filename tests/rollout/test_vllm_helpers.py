"""Parts of the vLLM engine that need no vLLM: the later-turn seeds made from a row's draws, and the hold that keeps
the engine awake (no CUDA sleep) across the turns of multi-turn episodes."""

from __future__ import annotations

import contextlib

import torch
from rollout_helpers import make_prompts, tiny_model

from grpo.envs.base import EnvReply
from grpo.rollout import Sampler
from grpo.rollout.episodes import run_episodes
from grpo.rollout.vllm_engine import VllmEngine, row_seeds


def test_row_seeds_use_two_draws_and_only_the_rows_own():
    u = torch.rand((100_000, 3), generator=torch.Generator().manual_seed(0))
    seeds = row_seeds(u)
    assert all(0 <= s < 2**31 - 1 for s in seeds)
    # 48 bits folded to 31: about n^2 / 2^32 = 2.3 equal pairs expected; one float32 draw (24 bits) would give ~300
    assert len(seeds) - len(set(seeds)) <= 10
    same_first = u[:4].clone()
    same_first[:, 0] = 0.5
    assert len(set(row_seeds(same_first))) == 4  # the second draw counts
    assert row_seeds(u[7:8]) == [seeds[7]] and row_seeds(u.flip(0))[::-1] == seeds  # no batch effect
    assert len(row_seeds(u[:5, :1])) == 5  # a one-token turn: its one draw


class _FakeLLM:
    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append("sleep")

    def wake_up(self):
        self.calls.append("wake")


def _engine_shell() -> VllmEngine:
    """A VllmEngine without vLLM: only the sleep-mode state, as on CUDA."""
    e = VllmEngine.__new__(VllmEngine)
    e.cuda, e._asleep, e._held, e.llm = True, False, 0, _FakeLLM()
    return e


def test_awake_holds_off_sleep_until_the_outermost_hold_ends():
    e = _engine_shell()
    with e.awake():
        e._sleep()  # what generate / generate_from_ids do after each call
        with e.awake():
            e._sleep()
        e._sleep()
        assert e.llm.calls == []
    assert e.llm.calls == ["sleep"] and e._asleep
    e._wake()
    e._sleep()  # not held: every generation sleeps, as before
    assert e.llm.calls == ["sleep", "wake", "sleep"]


class _HeldSampler(Sampler):
    """The native sampler plus an awake() hold that records whether each generation ran inside it."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.held, self.seen = 0, []

    @contextlib.contextmanager
    def awake(self):
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1

    def generate(self, *a, **k):
        self.seen.append(("generate", self.held))
        return super().generate(*a, **k)

    def generate_from_ids(self, *a, **k):
        self.seen.append(("generate_from_ids", self.held))
        return super().generate_from_ids(*a, **k)


class _TwoTurns:
    def __init__(self, prompt):
        self.k = 0

    def step(self, turn):
        self.k += 1
        return EnvReply(done=True) if self.k >= 2 else EnvReply(message="<result>1</result>\n", tool_calls=1)


def test_multi_turn_episodes_run_every_turn_inside_one_hold(tok):
    s = _HeldSampler(tiny_model("llama", tok, eos_bias=6.0), tok, max_new_tokens=8)
    run_episodes(s, make_prompts(), 2, _TwoTurns, max_turns=3, generator=torch.Generator().manual_seed(0))
    assert ("generate_from_ids", 1) in s.seen  # later turns ran
    assert all(held == 1 for _, held in s.seen) and s.held == 0
    s.seen.clear()
    run_episodes(s, make_prompts(), 2, None)  # single-turn: generate sleeps after itself as before
    assert s.seen == [("generate", 0)]
