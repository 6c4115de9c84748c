"""Multi-turn episodes (grpo.rollout.episodes): the ids trained on are the ids sampled, environment tokens are
attended but carry no loss, the limits cut and count, and a broken environment never stops the rollout."""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import make_prompts, tiny_model

from grpo.envs.base import EnvReply
from grpo.rollout import Sampler
from grpo.rollout.episodes import run_episodes


class CountingEnv:
    """Answers '<result>k</result>' to the first `turns - 1` turns, then ends the episode."""

    def __init__(self, prompt, turns: int = 3):
        self.k, self.turns = 0, turns

    def step(self, turn):
        self.k += 1
        if self.k >= self.turns:
            return EnvReply(done=True)
        return EnvReply(message=f"<result>{self.k}</result>\n", tool_calls=1)


def naive_logp(model, tok, prompt_text: str, completion: list[int]) -> torch.Tensor:
    """Reference: one forward over the unpadded sequence prompt + completion; log-prob of each completion token."""
    ids = tok(prompt_text, add_special_tokens=True)["input_ids"] + completion
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    P = len(ids) - len(completion)
    return torch.stack([lp[P + t - 1, completion[t]] for t in range(len(completion))])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_recomputed_log_probs_of_an_episode_equal_the_samplers(tok, arch):
    model = tiny_model(arch, tok, eos_bias=3.0)
    prompts = make_prompts()
    r = run_episodes(Sampler(model, tok, max_new_tokens=8), prompts, 3, CountingEnv, max_turns=4,
                     generator=torch.Generator().manual_seed(0))
    assert r.loss_mask is not None and sum(e["tool_calls"] for e in r.episodes) > 0
    multi = 0
    for i, ep in enumerate(r.episodes):
        n = int(r.completion_mask[i].sum())
        ids = r.completion_ids[i, :n].tolist()
        ref = naive_logp(model, tok, prompts[i // 3].text, ids)
        policy = r.loss_mask[i, :n].bool()
        torch.testing.assert_close(r.logp[i, :n][policy], ref[policy], atol=1e-4, rtol=0)
        assert torch.all(r.logp[i, :n][~policy] == 0)
        # environment tokens are the message tokenized once, where the turns say they are
        pos = 0
        for t in ep["turns"]:
            if t["role"] == "tool" and t["tokens"]:
                assert ids[pos:pos + t["tokens"]] == tok(t["text"], add_special_tokens=False)["input_ids"]
                assert not policy[pos:pos + t["tokens"]].any()
            pos += t["tokens"]
        multi += sum(t["role"] == "policy" for t in ep["turns"]) > 1
    assert multi > 0  # some episodes really had several policy turns


def test_the_trainers_forward_recomputes_the_samplers_log_probs(tok):
    """The shared-prefix training forward over a whole episode (attention mask = every token, loss mask = the
    policy's) gives the sampler's log-probs at the policy's tokens."""
    from grpo.models.forward import completion_token_logprobs

    model = tiny_model("llama", tok, eos_bias=3.0)
    r = run_episodes(Sampler(model, tok, max_new_tokens=8), make_prompts(), 2, CountingEnv, max_turns=3,
                     generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logp, _ = completion_token_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, 2)
    m = r.loss_mask.bool()
    torch.testing.assert_close(logp[m], r.logp[m], atol=1e-4, rtol=0)


def test_without_an_environment_it_is_generate(tok):
    model = tiny_model("llama", tok)
    s = Sampler(model, tok, max_new_tokens=6)
    a = run_episodes(s, make_prompts(), 2, None, generator=torch.Generator().manual_seed(3))
    b = s.generate(make_prompts(), 2, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.completion_ids, b.completion_ids) and a.loss_mask is None and a.episodes is None


def test_limits_cut_and_count_as_truncated(tok):
    model = tiny_model("llama", tok, eos_bias=3.0)
    s = Sampler(model, tok, max_new_tokens=8)
    r = run_episodes(s, make_prompts(), 2, lambda p: CountingEnv(p, turns=99), max_turns=2,
                     generator=torch.Generator().manual_seed(0))
    for ep in r.episodes:  # the environment never ends: every episode stops at a limit
        assert ep["truncated"] and ep["end"] in ("max_turns", "turn_limit")
        assert sum(t["role"] == "policy" for t in ep["turns"]) <= 2
    assert bool(r.truncated.all())
    r = run_episodes(s, make_prompts(), 2, lambda p: CountingEnv(p, turns=99), max_turns=9, max_tokens=30,
                     generator=torch.Generator().manual_seed(0))
    assert int(r.completion_mask.sum(-1).max()) <= 30 and bool(r.truncated.all())
    assert {e["end"] for e in r.episodes} <= {"max_tokens", "turn_limit"}


def test_an_environment_that_raises_ends_its_episode_only(tok):
    class Broken:
        def __init__(self, prompt):
            self.bad = prompt.uid == "p1"

        def step(self, turn):
            if self.bad:
                raise RuntimeError("boom")
            return EnvReply(done=True, reward=0.5)

    model = tiny_model("llama", tok, eos_bias=6.0)  # EOS first or soon: every first turn ends
    r = run_episodes(Sampler(model, tok, max_new_tokens=8), make_prompts(), 2, Broken,
                     generator=torch.Generator().manual_seed(0))
    for i, ep in enumerate(r.episodes):
        if i // 2 == 1:
            assert ep["end"] == "env_error" and ep["tool_errors"] == 1
            assert any(t["role"] == "error" and "boom" in t["text"] for t in ep["turns"])
        else:
            assert ep["end"] == "done" and ep["env_reward"] == 0.5


class MeetingEnv:
    """step waits at a barrier until every episode of the batch is inside step at the same time: it ends its episode
    with reward 1.0 when they all met, and raises (ending it as env_error) when the barrier times out or broke."""

    def __init__(self, barrier):
        self.barrier = barrier

    def step(self, turn):
        self.barrier.wait()
        return EnvReply(done=True, reward=1.0)


@pytest.mark.parametrize("workers", [8, 1])
def test_the_environments_of_a_turn_step_concurrently(tok, workers):
    """env.step_workers: with 8 threads the 8 episodes' environments are inside step at once (a slow sandboxed tool
    then costs one time limit per turn, not one per episode); with 1 they step one after another, so the barrier
    that needs all 8 at once never fills and breaks."""
    import threading

    model = tiny_model("llama", tok, eos_bias=6.0)  # EOS first or soon: every episode steps after turn 1
    barrier = threading.Barrier(8, timeout=30 if workers == 8 else 0.5)
    r = run_episodes(Sampler(model, tok, max_new_tokens=8), make_prompts(), 2, lambda p: MeetingEnv(barrier),
                     step_workers=workers, generator=torch.Generator().manual_seed(0))
    ends = [ep["end"] for ep in r.episodes]
    if workers == 8:
        assert ends == ["done"] * 8 and all(ep["env_reward"] == 1.0 for ep in r.episodes)
    else:
        assert ends == ["env_error"] * 8


def test_concurrent_steps_give_the_episodes_of_sequential_ones(tok):
    """Replies are applied in row order whatever order the threads finish in: the same ids, masks and records."""
    model = tiny_model("llama", tok, eos_bias=3.0)
    s = Sampler(model, tok, max_new_tokens=8)
    runs = [run_episodes(s, make_prompts(), 3, CountingEnv, max_turns=4, step_workers=w,
                         generator=torch.Generator().manual_seed(5)) for w in (1, 8)]
    assert sum(e["tool_calls"] for e in runs[0].episodes) > 0
    assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)
    assert torch.equal(runs[0].loss_mask, runs[1].loss_mask) and runs[0].episodes == runs[1].episodes


def test_step_workers_below_one_is_an_error(tok):
    with pytest.raises(ValueError, match="env.step_workers"):
        run_episodes(Sampler(tiny_model("llama", tok), tok, max_new_tokens=4), make_prompts(), 2, CountingEnv,
                     step_workers=0)


class CallingEnv:
    """Every turn 'calls a tool' (continues -> True); step counts how often the tool would have run."""

    runs = 0

    def __init__(self, prompt):
        pass

    def continues(self, turn):
        return True

    def step(self, turn):
        CallingEnv.runs += 1
        return EnvReply(message="<result>1</result>\n", tool_calls=1)


def test_the_last_allowed_turns_tool_calls_are_not_run(tok):
    """At env.max_turns an environment that would go on (continues(turn) is True) is not stepped: the episode is
    cut there as before, and its tools do not run for a reply no turn would read."""
    model = tiny_model("llama", tok, eos_bias=6.0)
    s = Sampler(model, tok, max_new_tokens=8)
    CallingEnv.runs = 0
    r = run_episodes(s, make_prompts(), 2, CallingEnv, max_turns=2, generator=torch.Generator().manual_seed(0))
    stepped = sum(len(e["turns"]) > 1 for e in r.episodes)  # turn 1 ended with EOS: a tool result, then turn 2
    assert {e["end"] for e in r.episodes} <= {"max_turns", "turn_limit"}
    assert sum(e["end"] == "max_turns" for e in r.episodes) > 0  # some turn 2 ended with EOS and called again
    assert CallingEnv.runs == stepped  # stepped after turn 1 only, never after the last turn
    assert all(e["tool_calls"] <= 1 for e in r.episodes)


def test_tool_environment_continues_exactly_when_the_turn_calls():
    from grpo.envs.tools import ToolEnvironment

    env = ToolEnvironment([], "tags")
    assert env.continues('<call>calculator("1+1")</call>') and env.continues("<call>broken")
    assert not env.continues("The answer is 2.")
