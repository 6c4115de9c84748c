"""Review: the loss mask at an episode's turn boundaries. The EOS the policy sampled to end a turn is its own token
(it decides when the environment answers) and is trained; the environment's tokens right after it are not."""

from __future__ import annotations

import torch
from rollout.rollout_helpers import make_prompts, tiny_model

from grpo.envs.base import EnvReply
from grpo.rollout import Sampler
from grpo.rollout.episodes import run_episodes


class Echo:
    """Answers 'ok' to the first two turns, then ends."""

    def __init__(self, prompt):
        self.k = 0

    def step(self, turn):
        self.k += 1
        return EnvReply(done=True) if self.k >= 3 else EnvReply(message="<result>ok</result>\n", tool_calls=1)


def test_each_policy_turn_is_trained_up_to_and_including_its_eos(tok):
    model = tiny_model("llama", tok, eos_bias=3.0)
    r = run_episodes(Sampler(model, tok, max_new_tokens=8), make_prompts(), 3, Echo, max_turns=4,
                     generator=torch.Generator().manual_seed(0))
    boundaries = 0
    for i, ep in enumerate(r.episodes):
        n = int(r.completion_mask[i].sum())
        ids, lm = r.completion_ids[i, :n].tolist(), r.loss_mask[i, :n].tolist()
        assert r.loss_mask[i, n:].sum() == 0 and r.logp[i, n:].abs().sum() == 0
        pos, turns = 0, [t for t in ep["turns"] if t["tokens"]]
        for k, t in enumerate(turns):
            span = range(pos, pos + t["tokens"])
            want = 1 if t["role"] == "policy" else 0
            assert [lm[j] for j in span] == [want] * t["tokens"], (i, k, t)
            if t["role"] == "policy" and k + 1 < len(turns):  # a turn the environment answered ended with EOS
                assert ids[span[-1]] == tok.eos_token_id and lm[span[-1]] == 1
                assert lm[span[-1] + 1] == 0  # the first environment token
                boundaries += 1
            pos += t["tokens"]
        assert pos == n
    assert boundaries > 0


class Talkative:
    """Replies with a message whose length depends on the prompt, so episodes of different prompts reach the
    episode's token budget at different turns."""

    def __init__(self, prompt):
        self.reply = "<result>" + "x" * (17 if prompt.uid == "p0" else 3) + "</result>\n"

    def step(self, turn):
        return EnvReply(message=self.reply, tool_calls=1)


def test_a_groups_later_turns_do_not_depend_on_the_other_prompts_in_the_batch(tok):
    """One generator per prompt (rollout.seed_per_prompt): a group's episodes are the same alone or batched with
    another prompt's, also when env.max_tokens leaves the episodes different room in a later turn."""
    model = tiny_model("llama", tok, eos_bias=4.0)
    sampler = Sampler(model, tok, max_new_tokens=20)
    prompts = make_prompts()[:2]

    def run(ps):
        gens = [torch.Generator().manual_seed(100 + int(p.uid[1:])) for p in ps]
        return run_episodes(sampler, ps, 3, Talkative, max_turns=6, max_tokens=55, generator=gens)

    both, alone = run(prompts), run(prompts[:1])
    assert [e["turns"] for e in both.episodes[:3]] == [e["turns"] for e in alone.episodes]
    n = alone.completion_ids.shape[1]
    assert torch.equal(both.completion_ids[:3, :n], alone.completion_ids)
