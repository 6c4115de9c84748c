"""rollout.stop attacked as an adversarial policy would (issue #51): a stop string inside a code fence or a tool
call, a stop string that is also the answer, a stop string in a multi-turn environment's turn. The policy is an
adversary of its reward: nothing about stop strings may let a completion raise it. Scripted completions go through
the rule every engine applies (StopScan.finish) and then the real reward, tool environment and episode code; the
sampler's own detection is checked against the naive reference in test_stop.py."""

from __future__ import annotations

import torch
from rollout_helpers import make_prompts, naive, tiny_model

from grpo.envs.base import EnvReply
from grpo.envs.calculator import calculator
from grpo.envs.tools import ToolEnvironment
from grpo.rewards.answers import exact_answer
from grpo.rewards.code_exec import extract_code
from grpo.rollout import Sampler
from grpo.rollout.episodes import run_episodes
from grpo.rollout.stop import StopScan


def scripted(tok, texts: list[str], stops, T: int = 64):
    """Rows sampled as these texts (the character tokenizer: one token a character), stopped by the engines' rule:
    (lengths (N,), stopped (N,), the texts the rewards see)."""
    rows = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    tokens = torch.tensor([r + [tok.pad_token_id] * (T - len(r)) for r in rows])
    return StopScan(tok, stops).finish(tokens, torch.tensor([len(r) for r in rows]))


def test_the_answer_after_a_stop_string_is_never_seen(tok):
    """A policy that writes a wrong first line and the right answer after the stop string gets the first line judged,
    not the answer; the same completion without a stop string would have been right."""
    texts = ["I do not know\n19", "19\nno, 20"]
    _, stopped, seen = scripted(tok, texts, ["\n"])
    assert seen == ["I do not know", "19"] and stopped.all()
    assert exact_answer(None, seen, ["19", "19"]) == [0.0, 1.0]  # only the first line counts
    assert exact_answer(None, texts, ["19", "19"]) == [1.0, 0.0]


def test_a_stop_string_that_is_the_answer_hides_it(tok):
    """rollout.stop=["19"] with answer 19: the text ends before it, so writing the answer scores 0, never more."""
    _, stopped, seen = scripted(tok, ["The answer is 19", "19"], ["19"])
    assert seen == ["The answer is ", ""] and stopped.all()
    assert exact_answer(None, seen, ["19", "19"]) == [0.0, 0.0]


def test_a_stop_string_inside_a_code_fence_ends_the_code(tok):
    """The stop string ends sampling wherever it is, inside a fence too (vLLM's meaning): the code reward then sees
    an unclosed fence, which holds no code block (0), whatever the code was."""
    text = "```python\nprint(19)\n```"
    _, stopped, seen = scripted(tok, [text], ["\n"])
    assert seen == ["```python"] and bool(stopped[0]) and extract_code(seen[0]) is None
    _, stopped, seen = scripted(tok, [text], ["```"])  # the fence itself as the stop string: nothing before it
    assert seen == [""] and extract_code(seen[0]) is None
    assert extract_code(text) == "print(19)\n"  # without the stop string the block is there


def test_a_stop_string_inside_a_tool_call_leaves_it_unclosed_and_unrun(tok):
    """A tool call cut by a stop string is an unclosed call: the environment answers that it is malformed (a tool
    error, counted), runs nothing, and no result of the tool reaches the policy."""
    env = ToolEnvironment([calculator], fmt="tags")
    text = '<call>calculator(\n"7*8")</call>'
    _, stopped, seen = scripted(tok, [text], ["\n"])
    assert seen == ["<call>calculator("] and bool(stopped[0])
    reply = env.step(seen[0])
    assert reply.tool_errors == 1 and "error" in reply.message and "56" not in reply.message
    assert env.step(text).message == "<result>56</result>\n"  # the whole call, for comparison


class EchoStopEnv:
    """Records every turn it is given and answers with a message that holds the stop string itself."""

    seen: list[str] = []

    def __init__(self, prompt):
        self.k = 0

    def step(self, turn):
        EchoStopEnv.seen.append(turn)
        self.k += 1
        return EnvReply(done=True) if self.k >= 3 else EnvReply(message="<result>a\nb</result>", tool_calls=1)


def test_a_stop_string_ends_a_policy_turn_and_not_the_environments_message(tok):
    """Multi-turn episodes with rollout.stop=["\\n"]: each policy turn ends at its own first newline (the naive
    reference on the turn's ids), the environment gets the turn's text without it, and the environment's messages,
    which hold the stop string, neither end a turn nor count: the next turn is sampled in full."""
    model = tiny_model("llama", tok)
    stops = ["\n", "]"]
    EchoStopEnv.seen = []
    r = run_episodes(Sampler(model, tok, max_new_tokens=40, stop=stops), make_prompts(), 2, EchoStopEnv,
                     max_turns=3, generator=torch.Generator().manual_seed(4))
    assert EchoStopEnv.seen and not any(s in turn for turn in EchoStopEnv.seen for s in stops)
    stopped_turns = later_turns = 0
    for i, ep in enumerate(r.episodes):
        ids = r.completion_ids[i, :int(r.completion_mask[i].sum())].tolist()
        pos, policy_turns = 0, 0
        for t in ep["turns"]:
            turn = ids[pos:pos + t["tokens"]]
            pos += t["tokens"]
            if t["role"] != "policy":
                continue
            policy_turns += 1
            k, text, hit = naive(tok, turn, stops)
            assert k == len(turn) and t["text"] == text  # ended at its first stop string, judged before it
            stopped_turns += hit
            later_turns += hit and policy_turns > 1
        if hit:  # the last policy turn ended at a stop string: finished, the environment stepped it, not cut off
            assert ep["end"] in ("done", "max_turns") and ep["end"] != "turn_limit", ep
    assert stopped_turns and later_turns  # turns after an environment message ended at their own stop string
    assert r.texts == [next(t["text"] for t in reversed(ep["turns"]) if t["role"] == "policy") for ep in r.episodes]
