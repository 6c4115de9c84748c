"""A conversation's opening messages as the policy's prompt text, the way the task libraries mean them to be read.

    tokenizer with a chat template   `apply_chat_template(messages, tools=..., add_generation_prompt=True)`:
                                     the model's own turn markers (and tool list, where its template shows one);
                                     the text is `templated` (grpo.tokens adds no special tokens again)
    no chat template (plain model)   the messages' contents, one paragraph each (a blank line between them), then
                                     a newline (a caller that has tools lists them in a message: `tool_listing`)

Used by the reasoning-gym tasks (grpo.data.reasoning_gym) and the verifiers adapter (grpo.envs.verifiers_env).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from grpo.tokens import apply_chat_template


def tool_listing(tools: Sequence[dict]) -> str:
    """A system message's text telling a model whose chat template shows no tools which tools it has and how to call
    them: grpo.envs.tools' tag format, `<call>name(argument=value, ...)</call>` with Python literals."""
    listed = "\n".join(json.dumps(t.get("function", t), sort_keys=True) for t in tools)
    return ("You can call these tools, one call per <call>...</call>, written as "
            "<call>name(argument=value, ...)</call> with Python literals; each result comes back as the next "
            f"message. Answer without a call when you are done.\n{listed}")


def message_text(content) -> str:
    """The text of a message's content: a string, or a list of content parts ({'type': 'text', 'text': ...})."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
        if text is not None:
            parts.append(str(text))
    return "".join(parts)


def render_messages(tokenizer, messages: Sequence[dict], tools: Sequence[dict] | None = None,
                    where: str = "a prompt") -> tuple[str, bool]:
    """(prompt text, templated) for `messages` ([{'role', 'content'}, ...]) and optional OpenAI-style tool
    definitions ([{'type': 'function', 'function': {'name', 'description', 'parameters'}}]) for the chat template.
    Raises ValueError when `messages` is empty or a message has no role, ChatTemplateError naming `where` (the
    row) when the template fails on them."""
    if not messages:
        raise ValueError("render_messages: no messages to render")
    plain = [{"role": m.get("role"), "content": message_text(m.get("content"))} for m in messages]
    for i, m in enumerate(plain):
        if not m["role"]:
            raise ValueError(f"render_messages: message {i} has no role: {messages[i]!r}")
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        kwargs = {"tools": list(tools)} if tools else {}
        text = apply_chat_template(tokenizer, plain, where, add_generation_prompt=True, **kwargs)  # names `where`
        return text, True
    paragraphs = [m["content"].strip() for m in plain if m["content"].strip()]
    return "\n\n".join(paragraphs) + "\n", False
