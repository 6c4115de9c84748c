"""What crosses between a verifiers environment and grpo's policy: tool calls parsed from the policy's text,
messages and tool definitions in verifiers' plain format, and the verifiers Client whose "model" is the policy
(grpo.envs.verifiers_env drives the episodes)."""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time

from grpo.envs.render import message_text
from grpo.scan import spans
from grpo.envs.tools import parse_calls
from grpo.errors import MissingExtraError

MODEL_NAME = "grpo-policy"  # what verifiers' state records as the model
_NAME = re.compile(r'"name"\s*:\s*"([^"]{0,256})"')  # the name of a call that is not JSON (on its first 4 KB)


def _vf():
    """`import verifiers as vf` with its classic environment API, or MissingExtraError saying what to install."""
    try:
        import verifiers as vf

        vf.MultiTurnEnv  # noqa: B018  (0.4's package root no longer has it)
        from verifiers.clients import Client  # noqa: F401
    except ImportError as e:
        raise MissingExtraError("verifiers environments need the verifiers package with its classic environment "
                                "API (SingleTurnEnv, MultiTurnEnv, ToolEnv): pip install 'grpo[verifiers]'") from e
    except AttributeError as e:
        import verifiers

        raise MissingExtraError(f"verifiers {getattr(verifiers, '__version__', '?')} has no classic environment API "
                                "(0.4 removed SingleTurnEnv/MultiTurnEnv/ToolEnv); install verifiers 0.3: pip install "
                                "'grpo[verifiers]'") from e
    return vf


# ---------------------------------------------------------------------------------------------- tool calls
def parse_tool_calls(text: str) -> tuple[str, list[dict]]:
    """(the text outside the calls, [{'id', 'name', 'arguments' (a JSON string), 'parsed' (bool)}]).
    A call that does not parse keeps its raw text as `arguments` (json.loads fails on it in the environment, which
    answers with an error message) and the name it gave, if one can be read."""
    calls = []
    found = spans(text, "<tool_call>", "</tool_call>")  # linear in the text (grpo.scan)
    for k, (a, b) in enumerate(found):
        raw = text[a:b].strip()
        try:
            obj = json.loads(raw)
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                raise ValueError("a tool call is a JSON object with a string 'name'")
            args = obj.get("arguments", {})
            if isinstance(args, str):
                json.loads(args)  # a JSON string of the arguments, as OpenAI's API sends them
            arguments = args if isinstance(args, str) else json.dumps(args)
            calls.append({"id": f"call_{k}", "name": obj["name"], "arguments": arguments, "parsed": True})
        except (ValueError, RecursionError):  # json.JSONDecodeError is a ValueError; nesting too deep recurses
            name = _NAME.search(raw[:4096])
            calls.append({"id": f"call_{k}", "name": name.group(1) if name else "", "arguments": raw,
                          "parsed": False})
    content = _outside(text, found, len("<tool_call>"), len("</tool_call>")).strip() if calls else text
    return content, calls


def _outside(text: str, found: list[tuple[int, int]], open_len: int, close_len: int) -> str:
    """`text` without the tagged spans `found` (content bounds), their tags included."""
    out, pos = [], 0
    for a, b in found:
        out.append(text[pos:a - open_len])
        pos = b + close_len
    return "".join(out) + text[pos:]


def _tag_tool_calls(text: str, params: dict[str, list[str]]) -> tuple[str, list[dict]]:
    """parse_tool_calls for grpo.envs.tools' tag format (`<call>name(args)</call>`, Python literals): positional
    arguments are named after the tool's parameters, in their schema's order. A call that does not parse, or names
    too many arguments, keeps the reason as its `arguments` (not JSON: the environment answers with an error)."""
    calls = []
    for k, c in enumerate(parse_calls(text, "tags")):
        names = params.get(c.name or "", [])
        error = c.error or (f"{c.name} takes {len(names)} arguments, got {len(c.args)} positional"
                            if c.name in params and len(c.args) > len(names) else None)
        if error:
            calls.append({"id": f"call_{k}", "name": c.name or "", "arguments": error, "parsed": False})
            continue
        args = dict(zip(names, c.args)) | dict(c.kwargs or {})
        calls.append({"id": f"call_{k}", "name": c.name, "arguments": json.dumps(args), "parsed": True})
    found = spans(text, "<call>", "</call>")
    content = _outside(text, found, len("<call>"), len("</call>"))
    content = (content.split("<call>", 1)[0] if "<call>" in content else content).strip() if calls else text
    return content, calls


def policy_tool_calls(text: str, fmt: str, params: dict[str, list[str]]) -> tuple[str, list[dict]]:
    """The tool calls of a policy turn in the call format `fmt` ('hermes' or 'tags', grpo.envs.tools)."""
    return parse_tool_calls(text) if fmt == "hermes" else _tag_tool_calls(text, params)


def _tool_params(env) -> dict[str, list[str]]:
    """{tool name: its parameter names in the schema's order}."""
    out = {}
    for t in _openai_tools(getattr(env, "tool_defs", None)):
        f = t["function"]
        out[f["name"]] = list((f.get("parameters") or {}).get("properties", {}))
    return out


def _openai_tools(tool_defs) -> list[dict]:
    """verifiers' tool definitions (vf.Tool or dicts with name, description, parameters) in the OpenAI format chat
    templates take (`apply_chat_template(..., tools=...)`)."""
    out = []
    for t in tool_defs or []:
        d = t.model_dump(exclude_none=True) if hasattr(t, "model_dump") else dict(t)
        out.append({"type": "function", "function": {k: d[k] for k in ("name", "description", "parameters")
                                                      if k in d}})
    return out


def _plain(messages) -> list[dict]:
    """verifiers' messages (pydantic models or dicts) as {'role', 'content'} dicts with text content."""
    out = []
    for m in messages or []:
        role = m.get("role") if isinstance(m, dict) else getattr(m, "role", None)
        content = m.get("content") if isinstance(m, dict) else getattr(m, "content", None)
        out.append({"role": role, "content": message_text(content)})
    return out


# ---------------------------------------------------------------------------------------------- the model side
@functools.cache
def _policy_client_class():
    _vf()
    from verifiers.clients import Client
    from verifiers.types import Response, ResponseMessage, ToolCall

    class PolicyClient(Client):
        """A verifiers Client whose model is grpo's policy: `get_native_response` publishes the request (the
        messages, verifiers' state) on `request` and waits for the episode's `step` to answer on `reply`."""

        def __init__(self, fmt: str | None, params: dict[str, list[str]]):
            super().__init__(None)
            self.fmt, self.params = fmt, params  # fmt None: the environment has no tools, nothing is parsed
            self.request: asyncio.Future | None = None
            self.reply: asyncio.Future | None = None

        def setup_client(self, config):
            return None

        async def to_native_tool(self, tool):
            return tool

        async def to_native_prompt(self, messages):
            return messages, {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
            self.reply = asyncio.get_running_loop().create_future()
            self.request.set_result((prompt, kwargs.get("state")))
            return await self.reply

        async def raise_from_native_response(self, response):
            return None

        async def from_native_response(self, text: str):
            content, calls = policy_tool_calls(text, self.fmt, self.params) if self.fmt else (text, [])
            tool_calls = [ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"]) for c in calls] or None
            message = ResponseMessage(content=content, tool_calls=tool_calls, is_truncated=False,
                                      finish_reason="tool_calls" if tool_calls else "stop")
            return Response(id=f"grpo-{time.monotonic_ns()}", created=int(time.time()), model=MODEL_NAME,
                            message=message)

        async def close(self):
            return None

    return PolicyClient
