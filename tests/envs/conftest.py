"""Fixtures of the environment and tool tests (grpo.envs): the built-in character tokenizer, and a tiny tokenizer
carrying a Qwen-style chat template with a tool-call format."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tok():
    from grpo.models.builtin import build_tokenizer

    return build_tokenizer()


# A trimmed Qwen2.5-style template: tools listed in the system turn, calls as <tool_call>{json}</tool_call>, tool
# results as a user turn wrapped in <tool_response>, <|im_end|> closing every turn.
QWEN_STYLE = (
    "{% if tools %}<|im_start|>system\nYou may call functions.\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    "Return a call as <tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
    "<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "<|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="session")
def qwen_tok():
    """The built-in character tokenizer plus <|im_start|>/<|im_end|> special tokens (EOS = <|im_end|>) and the
    Qwen-style template above."""
    from grpo.models.builtin import build_tokenizer

    t = build_tokenizer()
    t.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    t.eos_token = "<|im_end|>"
    t.chat_template = QWEN_STYLE
    return t
