"""How an environment's message becomes token ids (once, when it is appended to an episode).

    plain prompt (Prompt.templated False)   the message's text as it is: `tokenizer(text, add_special_tokens=False)`
    chat-templated prompt                   the message rendered by the tokenizer's chat template under its role
                                            (the template's own turn wrapper), followed by the generation prompt
                                            of the next assistant turn

For a templated prompt the text is what the template writes between the end of an assistant turn's content and
the start of the next assistant turn's content: the assistant turn's closing (minus the EOS the policy already
sampled, e.g. Qwen's `<|im_end|>`), the environment's turn, and the generation prompt. It is taken as the
difference of two renders of a fixed conversation, so it does not depend on the episode's earlier text.

A message is text, never markup: where it contains the text of any token the tokenizer added ('<|im_end|>',
'<eos>', and added tokens that are not flagged special, such as Qwen3's '<tool_call>' and '</tool_response>': a tool
result echoing what the policy wrote, a program's output), that text is tokenized as ordinary characters, so an
environment message cannot close its own turn or forge another one; the template's own markers stay tokens.
(split_special_tokens covers only the special ones; the others are cut apart here: `_literal_ids`.) Markers a
template writes as plain text without an added token are ordinary text to the tokenizer anyway.
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


_CONTENT = "\u2063grpo-environment-content\u2063"  # marks where a message's content goes in a template's render


def _ids(tokenizer, text: str, literal: bool = False) -> list[int]:
    # verbose=False: a reply longer than the model's context is the episode's limit to cut (env.max_tokens), not a
    # tokenizer warning; literal: special tokens' texts are read as ordinary characters
    kwargs = {"split_special_tokens": True} if literal else {}
    return list(tokenizer(text, add_special_tokens=False, verbose=False, **kwargs)["input_ids"])


def _control_texts(tokenizer) -> list[str]:
    """The texts of every token the tokenizer added, special or not, longest first."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return sorted({t.content for t in decoder.values() if getattr(t, "content", "")}, key=len, reverse=True)


def _literal_ids(tokenizer, text: str) -> list[int]:
    """Ids of `text` with every added token's text read as ordinary characters: special ones through
    split_special_tokens, the others by tokenizing each occurrence one character at a time (no single character
    forms a multi-character added token). Linear in the text: the pieces between occurrences go to the tokenizer in
    one batch, and each added token's spelling is tokenized once (a tool result of 100 KB of '<tool_call>x' took
    3 s one piece at a time)."""
    hits = []  # (start, -length, text) of every occurrence of every added token's text: one scan a token
    for c in _control_texts(tokenizer):
        i = text.find(c)
        while i >= 0:
            hits.append((i, -len(c), c))
            i = text.find(c, i + 1)
    plain, spelled, pos = [], [], 0  # plain[k] comes before spelled[k]; one more plain piece ends the text
    for i, _, c in sorted(hits):  # leftmost first, the longest at a position; overlapped ones are skipped
        if i >= pos:
            plain.append(text[pos:i])
            spelled.append(c)
            pos = i + len(c)
    plain.append(text[pos:])
    plain_ids = tokenizer(plain, add_special_tokens=False, verbose=False, split_special_tokens=True)["input_ids"]
    by_char = {c: [t for ch in c for t in _ids(tokenizer, ch, literal=True)] for c in set(spelled)}
    out: list[int] = []
    for ids, c in zip(plain_ids, spelled):
        out += list(ids) + by_char[c]
    return out + list(plain_ids[-1])


def env_message_ids(tokenizer, message: str, role: str, templated: bool, policy_ended_with_eos: bool) -> list[int]:
    """Token ids of an environment message appended after a policy turn (module docstring). Raises ValueError when
    the message holds a special token's text and the template does not write the message as it is (then its text
    cannot be told from the template's markers)."""
    if not any(s in message for s in _control_texts(tokenizer)):
        return _ids(tokenizer, templated_env_text(tokenizer, role, message, policy_ended_with_eos) if templated
                    else message)
    if not templated:
        return _literal_ids(tokenizer, message)
    full = templated_env_text(tokenizer, role, message, policy_ended_with_eos)
    before, found, after = templated_env_text(tokenizer, role, _CONTENT, policy_ended_with_eos).partition(_CONTENT)
    if not found or full != before + message + after:
        raise ValueError(f"an environment message with a special token's text, under role {role!r}: the chat "
                         "template does not write it as it is, so its text cannot be kept apart from the markers")
    return _ids(tokenizer, before) + _literal_ids(tokenizer, message) + _ids(tokenizer, after)
