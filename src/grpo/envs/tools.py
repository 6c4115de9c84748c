"""Tools: Python functions the policy calls from its turns, and the environment that runs them.

A tool is a Python function with type-annotated parameters and a docstring (Google style, `Args:` describing each
parameter), as in TRL: `tool_schema` turns it into the JSON schema chat templates take (`apply_chat_template(...,
tools=[...])`). `tools_of(obj)` also accepts an environment object whose public methods are its tools (TRL's
`environment_factory` convention: one object per episode, so its tools may keep the episode's state).

Call formats (`call_format_for(tokenizer)` picks one):
    hermes  the chat template's own format when it has one (Qwen 2.5/3, Hermes and others render tools this way):
                <tool_call>
                {"name": "calculator", "arguments": {"expression": "347*56"}}
                </tool_call>
            results go back as `tool` messages, which the template wraps (e.g. <tool_response>...</tool_response>)
    tags    for tokenizers without one (the built-in model's): a Python-style call between tags, arguments as
            Python literals, positional or by keyword, and the result as a tagged line:
                <call>calculator("347*56")</call>        ->  <result>19432</result>\n
                <call>python(code="print(2**10)")</call>  ->  <result>1024\n</result>\n
Every call in a turn is run, in order (at most `max_calls` per turn). A turn without any call ends the episode: it
is the answer, scored by the task's reward functions.

Never an exception out of `ToolEnvironment.step`: a malformed call, an unknown tool, wrong arguments, a tool that
raises or runs past its time limit each give an error message as that call's result (`error: ...`), counted in
`tool_errors`, and the episode goes on. A tool marked `fn.in_process = True` (the calculator: pure and bounded) is
called directly; any other runs in a daemon thread and is abandoned at its time limit (Python cannot stop a
thread: use the `python` tool, a killed sandbox process, for code that may not return).
"""

from __future__ import annotations

import ast
import inspect
import json
import threading
from dataclasses import dataclass
from typing import Any, Callable

from grpo.envs.base import EnvReply
from grpo.scan import between

FORMATS = ("hermes", "tags")


def call_format_for(tokenizer) -> str:
    """'hermes' when the tokenizer's chat template writes <tool_call> blocks, else 'tags'."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # several named templates
        template = " ".join(str(t) for t in template.values())
    return "hermes" if "<tool_call>" in str(template) else "tags"


NOT_TOOLS = frozenset({"reset", "step", "continues"})  # an environment object's episode methods (TRL's reset, ours)


def tools_of(obj) -> list[Callable]:
    """A list of functions as they are, or an object's public bound methods but `reset`/`step` (TRL's environment
    class convention)."""
    if isinstance(obj, (list, tuple)):
        fns = list(obj)
    else:
        fns = [getattr(obj, name) for name in dir(obj) if not name.startswith("_") and name not in NOT_TOOLS
               and callable(getattr(obj, name)) and inspect.ismethod(getattr(obj, name))]
    for fn in fns:
        if not callable(fn) or not getattr(fn, "__name__", None):
            raise TypeError(f"a tool must be a named function, got {fn!r}")
    names = [fn.__name__ for fn in fns]
    if len(set(names)) != len(names):
        raise ValueError(f"tool names must be unique, got {names}")
    return fns


def tool_schema(fn: Callable) -> dict:
    """The JSON schema of a tool ({'type': 'function', 'function': {name, description, parameters}}) from its
    signature and docstring (transformers' get_json_schema; ValueError naming the function when it cannot)."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as e:  # transformers' DocstringParsingException / TypeHintParsingException
        raise ValueError(f"tool {getattr(fn, '__name__', fn)!r} needs type hints on every parameter and a docstring "
                         f"with an Args: section describing each: {e}") from e


@dataclass
class Call:
    """One parsed call: the tool's name and its arguments (positional and by keyword), or the parse error."""

    name: str | None
    args: tuple = ()
    kwargs: dict | None = None
    error: str | None = None


def _tag_call(body: str) -> Call:
    try:
        node = ast.parse(body.strip(), mode="eval").body
    except SyntaxError as e:
        return Call(None, error=f"malformed call {body.strip()[:40]!r}: {e.msg}")
    except (ValueError, MemoryError, RecursionError):  # null bytes; nesting deep enough to overflow the parser
        return Call(None, error=f"malformed call {body.strip()[:40]!r}: not a Python call (nested too deeply?)")
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return Call(None, error=f"malformed call {body.strip()[:40]!r}: expected name(arguments)")
    try:
        args = tuple(ast.literal_eval(a) for a in node.args)
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return Call(node.func.id, error=f"arguments of {node.func.id} must be Python literals (strings, numbers, "
                                        "lists, dicts)")
    if any(k.arg is None for k in node.keywords):
        return Call(node.func.id, error="**arguments are not allowed")
    return Call(node.func.id, args, kwargs)


def _hermes_call(body: str) -> Call:
    try:
        obj = json.loads(body)
    except ValueError as e:
        return Call(None, error=f"malformed tool call (not JSON): {e}")
    except RecursionError:
        return Call(None, error="malformed tool call (not JSON): nested too deeply")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return Call(None, error='malformed tool call: expected {"name": ..., "arguments": {...}}')
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return Call(obj["name"], error=f"arguments of {obj['name']} are not JSON")
    if not isinstance(arguments, dict):
        return Call(obj["name"], error=f"arguments of {obj['name']} must be an object")
    return Call(obj["name"], (), arguments)


def parse_calls(text: str, fmt: str) -> list[Call]:
    """The calls in a policy turn, in order; an opened but unclosed call is a malformed one."""
    if fmt not in FORMATS:
        raise ValueError(f"tool call format must be one of {FORMATS}, got {fmt!r}")
    parse, opener, closer = ((_hermes_call, "<tool_call>", "</tool_call>") if fmt == "hermes"
                             else (_tag_call, "<call>", "</call>"))
    calls = [parse(body.strip() if fmt == "hermes" else body) for body in between(text, opener, closer)]  # linear
    if text.count(opener) > text.count(closer):
        calls.append(Call(None, error=f"malformed call: {opener} without {closer}"))
    return calls


def _run_with_timeout(fn: Callable, args: tuple, kwargs: dict, timeout_s: float):
    """fn(*args, **kwargs) in a daemon thread; TimeoutError after timeout_s (the thread is abandoned)."""
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - reported as the call's result
            box["error"] = e

    t = threading.Thread(target=target, daemon=True, name=f"grpo-tool-{fn.__name__}")
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise TimeoutError(f"{fn.__name__} did not return within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def call_tool(tools: dict[str, Callable], call: Call, timeout_s: float, max_chars: int) -> tuple[str, bool]:
    """(result text, ok) of one call, cut at max_chars; never raises for anything the call or the tool does."""
    text, ok = _call_tool(tools, call, timeout_s)
    return (text[:max_chars] + " ...(truncated)") if len(text) > max_chars else text, ok


def _call_tool(tools: dict[str, Callable], call: Call, timeout_s: float) -> tuple[str, bool]:
    if call.error is not None:
        return f"error: {call.error}", False
    fn = tools.get(call.name)
    if fn is None:
        return f"error: unknown tool {call.name!r}; tools: {', '.join(sorted(tools))}", False
    try:
        inspect.signature(fn).bind(*call.args, **(call.kwargs or {}))
    except TypeError as e:
        return f"error: wrong arguments for {call.name}: {e}", False
    except ValueError:  # a builtin without a signature: let the call say
        pass
    try:
        if getattr(fn, "in_process", False):
            value = fn(*call.args, **(call.kwargs or {}))
        else:
            value = _run_with_timeout(fn, call.args, call.kwargs or {}, timeout_s)
    except TimeoutError as e:
        return f"error: {e}", False
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the tool's failure is the model's information (a tool
        return f"error: {type(e).__name__}: {e}", False  # calling sys.exit, as argparse does, must not end the run)
    try:  # e.g. an int past Python's 4300-digit str limit, a circular structure
        return (value if isinstance(value, str) else json.dumps(value, default=str)), True
    except Exception as e:  # noqa: BLE001
        return f"error: the result of {call.name} cannot be written as text: {type(e).__name__}: {e}", False


class ToolEnvironment:
    """One episode's tool-using environment: each policy turn's calls are run and their results are the reply; a
    turn without calls ends the episode (the task's reward functions score it).

    tools: functions, or an object whose public methods are the tools (see `tools_of`); fmt: 'hermes' | 'tags';
    timeout_s: per call (tools not marked in_process); max_calls: per turn (more is an error for the extra ones);
    max_chars: a result longer than this is cut.
    """

    def __init__(self, tools, fmt: str = "tags", *, timeout_s: float = 5.0, max_calls: int = 4,
                 max_chars: int = 400):
        if fmt not in FORMATS:
            raise ValueError(f"tool call format must be one of {FORMATS}, got {fmt!r}")
        self.tools = {fn.__name__: fn for fn in tools_of(tools)}
        self.fmt, self.timeout_s, self.max_calls, self.max_chars = fmt, timeout_s, max_calls, max_chars

    def continues(self, turn: str) -> bool:
        """True when the turn calls a tool (step would run it and answer), False when it is the answer."""
        return bool(parse_calls(turn, self.fmt))

    def step(self, turn: str) -> EnvReply:
        calls = parse_calls(turn, self.fmt)
        if not calls:
            return EnvReply(done=True)
        results, errors = [], 0
        for i, call in enumerate(calls):
            if i >= self.max_calls:
                text, ok = f"error: more than {self.max_calls} calls in one turn; this one was not run", False
            else:
                text, ok = call_tool(self.tools, call, self.timeout_s, self.max_chars)
            results.append(text)
            errors += not ok
        return EnvReply(message=self.format_results(results), role="tool", tool_calls=len(calls), tool_errors=errors,
                        info={"calls": [c.name for c in calls]})

    def format_results(self, results: list[str]) -> str:
        """tags: one '<result>...</result>' line per call; hermes: the results one per line (the template wraps
        the tool message)."""
        if self.fmt == "tags":
            return "".join(f"<result>{r}</result>\n" for r in results)
        return "\n".join(results)


def python_tool(timeout_s: float = 10.0, memory_mb: int = 512) -> Callable:
    """The built-in `python` tool: runs a program in grpo.sandbox (bubblewrap; the fallbacks only with
    reward.sandbox=unsafe_local) and returns its output. Refuses at creation, with the sandbox's own
    SandboxUnavailable message, where no sandbox may run."""
    from grpo.sandbox import resolve_backend, run_python

    resolve_backend()  # SandboxUnavailable here, before any episode, like the code rewards

    def python(code: str) -> str:
        """Run a Python program in a sandbox and return what it printed.

        Args:
            code: the program; its standard output (and the error, if it fails) is the result.
        """
        r = run_python(code, timeout=timeout_s, memory_mb=memory_mb, site_packages=False)
        if r.status == "passed":
            return r.stdout
        tail = r.stderr.strip().splitlines()[-1:] if r.stderr.strip() else []
        return f"{r.stdout}[{r.status}{': ' + tail[0] if tail else ''}]"

    python.in_process = True  # it already runs in a killed-at-the-deadline sandbox process
    return python
