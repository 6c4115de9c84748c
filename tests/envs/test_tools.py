"""Tools: call parsing in both formats (the chat template's own, with a tiny tokenizer carrying a Qwen-style
template, and the tag format), schemas from signatures and docstrings, and a tool that raises, hangs, is unknown
or is called wrongly: an error message as the result, never an exception, and the episode goes on."""

from __future__ import annotations

import json
import time

import torch

from grpo.envs.base import EnvReply
from grpo.envs.calculator import calculator
from grpo.envs.chat import env_message_ids, templated_env_text
from grpo.envs.tools import ToolEnvironment, call_format_for, parse_calls, tool_schema, tools_of


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def boom(x: str) -> str:
    """Always fails.

    Args:
        x: anything
    """
    raise RuntimeError(f"broken on {x}")


def sleepy(x: str) -> str:
    """Never returns in time.

    Args:
        x: anything
    """
    time.sleep(30)
    return x


def test_tag_format_parsing():
    calls = parse_calls('I will call <call>calculator("347*56")</call> then <call>add(2, b=3)</call>', "tags")
    assert [(c.name, c.args, c.kwargs, c.error) for c in calls] == [
        ("calculator", ("347*56",), {}, None), ("add", (2,), {"b": 3}, None)]
    assert parse_calls("no call here: 19432", "tags") == []
    bad = parse_calls("<call>calculator(347*</call>", "tags")
    assert bad[0].error and "malformed" in bad[0].error
    assert "literals" in parse_calls("<call>add(x, 1)</call>", "tags")[0].error  # a name is not a literal
    assert "without </call>" in parse_calls('<call>calculator("1+1")', "tags")[-1].error


def test_chat_template_tool_calls_are_parsed_and_results_rendered_by_it(qwen_tok):
    assert call_format_for(qwen_tok) == "hermes"
    # the template's own rendering of the tools (apply_chat_template(tools=...)) lists the schema
    system = qwen_tok.apply_chat_template([{"role": "user", "content": "What is 3 × 4?"}], tools=[tool_schema(add)],
                                          tokenize=False, add_generation_prompt=True)
    assert '"name": "add"' in system and system.endswith("<|im_start|>assistant\n")
    turn = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
    (call,) = parse_calls(turn, "hermes")
    assert (call.name, call.kwargs) == ("add", {"a": 3, "b": 4})
    as_string = parse_calls('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>', "hermes")
    assert as_string[0].kwargs == {"a": 1, "b": 2}
    assert "not JSON" in parse_calls("<tool_call>{name: add}</tool_call>", "hermes")[0].error
    reply = ToolEnvironment([add], "hermes").step(turn)
    assert (reply.message, reply.role, reply.tool_calls, reply.tool_errors, reply.done) == ("7", "tool", 1, 0, False)
    # appended after the policy's <|im_end|>: the rest of the assistant turn's closing, the tool turn in the
    # template's wrapper, and the generation prompt of the next assistant turn (hand-written expectation)
    want = "\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert templated_env_text(qwen_tok, "tool", "7", True) == want
    ids = env_message_ids(qwen_tok, "7", "tool", True, True)
    assert ids == qwen_tok(want, add_special_tokens=False)["input_ids"]
    assert qwen_tok.convert_tokens_to_ids("<|im_start|>") in ids  # special tokens as single ids
    # a plain (not templated) prompt gets the text as it is
    assert env_message_ids(qwen_tok, "<result>7</result>\n", "tool", False, True) == \
        qwen_tok("<result>7</result>\n", add_special_tokens=False)["input_ids"]


def test_builtin_tokenizer_uses_tags(tok):
    assert call_format_for(tok) == "tags"


def test_schema_from_signature_and_docstring():
    s = tool_schema(add)["function"]
    assert s["name"] == "add" and s["description"] == "Add two integers."
    assert s["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first"}
    assert s["parameters"]["required"] == ["a", "b"]


def test_public_methods_of_an_environment_object_are_its_tools():
    class Counter:
        def __init__(self):
            self.n = 0

        def increment(self, by: int) -> int:
            """Add to the counter.

            Args:
                by: how much
            """
            self.n += by
            return self.n

        def _private(self):
            return None

        def reset(self, **kwargs):  # TRL's episode start: not a tool
            self.n = 0

    c = Counter()
    env = ToolEnvironment(c, "tags")
    assert sorted(env.tools) == ["increment"]
    env.step("<call>increment(2)</call>")
    assert env.step("<call>increment(by=3)</call>").message == "<result>5</result>\n" and c.n == 5  # state kept
    assert [f.__name__ for f in tools_of([add, calculator])] == ["add", "calculator"]


def test_failures_are_results_not_exceptions():
    env = ToolEnvironment([add, boom, sleepy, calculator], "tags", timeout_s=0.5, max_calls=5)
    t0 = time.perf_counter()
    reply = env.step('<call>boom("x")</call><call>sleepy("y")</call><call>nope(1)</call><call>add(1)</call>'
                     '<call>calculator("2**99999")</call><call>add(1, 2)</call>')
    assert time.perf_counter() - t0 < 5
    lines = reply.message.splitlines()
    assert lines[0] == "<result>error: RuntimeError: broken on x</result>"
    assert lines[1] == "<result>error: sleepy did not return within 0.5 s</result>"
    assert lines[2].startswith("<result>error: unknown tool 'nope'")
    assert lines[3].startswith("<result>error: wrong arguments for add")
    assert "too large" in lines[4]
    assert lines[5] == "<result>error: more than 5 calls in one turn; this one was not run</result>"
    assert (reply.tool_calls, reply.tool_errors, reply.done) == (6, 6, False)
    assert env.step("the answer is 3").done  # no call: the episode's answer


def test_a_raising_or_hanging_tool_and_the_episode_goes_on(tok):
    """In a rollout: the tool's error comes back as its result, and the policy takes its next turn."""
    from rollout.rollout_helpers import make_prompts, tiny_model

    from grpo.rollout import Sampler
    from grpo.rollout.episodes import run_episodes

    class Scripted:
        """The policy's turns are random here: the environment plays a fixed call each turn, through the tools."""

        def __init__(self, prompt):
            self.tools, self.k = ToolEnvironment([boom, sleepy], "tags", timeout_s=0.2), 0

        def step(self, turn):
            self.k += 1
            if self.k == 3:
                return EnvReply(done=True)
            return self.tools.step('<call>boom("a")</call>' if self.k == 1 else '<call>sleepy("b")</call>')

    model = tiny_model("llama", tok, eos_bias=6.0)
    r = run_episodes(Sampler(model, tok, max_new_tokens=6), make_prompts()[:2], 2, Scripted, max_turns=4,
                     generator=torch.Generator().manual_seed(0))
    for ep in r.episodes:
        roles = [t["role"] for t in ep["turns"]]
        assert roles == ["policy", "tool", "policy", "tool", "policy"], ep
        assert "broken on a" in ep["turns"][1]["text"] and "did not return" in ep["turns"][3]["text"]
        assert (ep["tool_calls"], ep["tool_errors"], ep["end"], ep["truncated"]) == (2, 2, "done", False)


def test_python_tool_runs_in_the_sandbox_or_refuses_like_it(tmp_path):
    """The program runs, and in the sandbox: a directory of the host that the trainer can write to is not there for
    it (bwrap mounts none), and /etc is not writable, each refused with the error the program itself met."""
    import os
    import re

    import pytest

    from grpo.envs.tools import python_tool
    from grpo.sandbox import SandboxUnavailable

    try:
        python = python_tool(timeout_s=5)
    except SandboxUnavailable as e:
        assert "bubblewrap" in str(e) or "bwrap" in str(e)
        pytest.skip(f"no sandbox here: {e}")
    env = ToolEnvironment([python], "tags")
    assert env.step('<call>python("print(2**10)")</call>').message == "<result>1024\n</result>\n"
    host_file = tmp_path / "escaped"
    out = env.step(f'<call>python("open(\'{host_file}\', \'w\').write(\'x\')")</call>').message
    assert out == f"<result>[failed: FileNotFoundError: [Errno 2] No such file or directory: '{host_file}']</result>\n"
    assert not host_file.exists()
    out = env.step('<call>python("import os; os.open(\'/etc/x\', os.O_CREAT|os.O_WRONLY)")</call>').message
    assert re.fullmatch(r"<result>\[failed: (PermissionError: \[Errno 13\] Permission denied|OSError: \[Errno 30\] "
                        r"Read-only file system): '/etc/x'\]</result>\n", out), out
    assert not os.path.exists("/etc/x")
    assert json.dumps(tool_schema(python))  # a proper schema


def test_an_episode_under_a_chat_template_keeps_the_templates_turns(qwen_tok):
    """A templated prompt: each tool reply is appended as the template writes it (closing of the assistant turn,
    the tool turn, the next generation prompt), and the policy's log-probs recompute over the kept ids."""
    from rollout.rollout_helpers import tiny_model

    from grpo.rollout import Sampler
    from grpo.rollout.episodes import run_episodes
    from grpo.types import Prompt

    class Replies:
        def __init__(self, prompt):
            self.k = 0

        def step(self, turn):
            self.k += 1
            return EnvReply(done=True) if self.k == 2 else EnvReply(message="7", role="tool", tool_calls=1)

    text = qwen_tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], tools=[tool_schema(add)],
                                        tokenize=False, add_generation_prompt=True)
    prompts = [Prompt(uid="q", text=text, templated=True)]
    model = tiny_model("qwen2", qwen_tok, eos_bias=4.0)
    r = run_episodes(Sampler(model, qwen_tok, max_new_tokens=6), prompts, 3, Replies, max_turns=3,
                     generator=torch.Generator().manual_seed(0))
    want = qwen_tok("\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
                    add_special_tokens=False)["input_ids"]
    prompt_ids = qwen_tok(text, add_special_tokens=False)["input_ids"]
    checked = 0
    for i, ep in enumerate(r.episodes):
        if ep["end"] != "done":
            continue
        n = int(r.completion_mask[i].sum())
        ids = r.completion_ids[i, :n].tolist()
        first = ep["turns"][0]["tokens"]
        assert ids[first - 1] == qwen_tok.eos_token_id and ids[first:first + len(want)] == want
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([prompt_ids + ids])).logits[0].float(), -1)
        ref = torch.stack([lp[len(prompt_ids) + t - 1, ids[t]] for t in range(n)])
        policy = r.loss_mask[i, :n].bool()
        torch.testing.assert_close(r.logp[i, :n][policy], ref[policy], atol=1e-4, rtol=0)
        checked += 1
    assert checked > 0
