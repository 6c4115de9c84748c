"""How an environment's message becomes token ids (once, when it is appended to an episode).

    plain prompt (Prompt.templated False)   the message's text as it is: `tokenizer(text, add_special_tokens=False)`
    chat-templated prompt                   the message rendered by the tokenizer's chat template under its role
                                            (the template's own turn wrapper), followed by the generation prompt
                                            of the next assistant turn

For a templated prompt the text is what the template writes between the end of an assistant turn's content and
the start of the next assistant turn's content: the assistant turn's closing (minus the EOS the policy already
sampled, e.g. Qwen's `<|im_end|>`), the environment's turn, and the generation prompt. It is taken as the
difference of two renders of a fixed conversation, so it does not depend on the episode's earlier text.
"""

from __future__ import annotations

_SENTINEL = "\u2063grpo-assistant-content\u2063"  # unlikely text marking where an assistant turn's content ends


def _render(tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def templated_env_text(tokenizer, role: str, message: str, policy_ended_with_eos: bool) -> str:
    """The text a chat template writes after an assistant turn's content for an environment message under
    `role`, up to where the next assistant turn's content starts. Raises ValueError naming the role when the
    template cannot render such a turn (or renders earlier turns differently once it is added)."""
    head = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _SENTINEL}]
    try:
        base = _render(tokenizer, head, False)
        full = _render(tokenizer, head + [{"role": role, "content": message}], True)
    except Exception as e:  # jinja's TemplateError, a template's raise_exception
        raise ValueError(f"the tokenizer's chat template cannot render an environment message with role {role!r}: "
                         f"{e}") from e
    if not full.startswith(base) or _SENTINEL not in base:
        raise ValueError(f"the tokenizer's chat template renders the conversation differently once a {role!r} "
                         "message follows an assistant turn; environment messages need an appendable template")
    closing = base[base.rindex(_SENTINEL) + len(_SENTINEL):]
    eos = getattr(tokenizer, "eos_token", None)
    if policy_ended_with_eos and eos and closing.startswith(eos):
        closing = closing[len(eos):]
    return closing + full[len(base):]


def env_message_ids(tokenizer, message: str, role: str, templated: bool, policy_ended_with_eos: bool) -> list[int]:
    """Token ids of an environment message appended after a policy turn (module docstring)."""
    text = templated_env_text(tokenizer, role, message, policy_ended_with_eos) if templated else message
    # verbose=False: a reply longer than the model's context is the episode's limit to cut (env.max_tokens), not a
    # tokenizer warning
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
