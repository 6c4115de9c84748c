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
(split_special_tokens covers only the special ones; the others are cut apart here: `_literal_ids`.) The same holds,
under a chat template, for the turn markers the template writes as plain text ('<|user|>' in a Zephyr-style
template, '[INST]', '### Response:': `_marker_texts`): in a message they are tokenized one character at a time,
which gives other ids than the template's own marker wherever the tokenizer merges the marker's characters (a
tokenizer without merges for them, byte by byte, has no other ids to give: there the text stays as it is).
"""

from __future__ import annotations

import re

_SENTINEL = "\u2063grpo-assistant-content\u2063"  # unlikely text marking where an assistant turn's content ends
_TURN = re.compile("\u2063grpo-turn-[0-9]+\u2063")  # placeholder contents of the render _marker_texts reads


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


def _marker_texts(tokenizer, role: str, controls: list[str]) -> list[str]:
    """The turn markers a chat template writes as plain text: the template's own text around the messages of a
    rendered conversation (system, user, assistant, `role`, with placeholder contents), cut into lines and at the
    added tokens' texts (`controls`, already neutral), each piece stripped and kept when it is two characters or
    more and holds one that is not a letter, digit or space ('<|user|>', '[INST]', '### Response:'; not 'user').
    [] when the template cannot render such a conversation."""
    roles = ["system", "user", "assistant", role]
    for convo in (roles, roles[1:]):  # some templates refuse a system message
        try:
            text = _render(tokenizer, [{"role": r, "content": f"\u2063grpo-turn-{k}\u2063"}
                                       for k, r in enumerate(convo)], True)
            break
        except Exception:  # noqa: BLE001 - jinja's TemplateError, a template's raise_exception
            continue
    else:
        return []
    pieces = set()
    for line in (ln for gap in _TURN.split(text) for ln in gap.splitlines()):
        for c in controls:
            line = line.replace(c, "\n")
        pieces.update(p.strip() for p in line.split("\n"))
    return sorted(p for p in pieces if len(p) >= 2 and any(not (ch.isalnum() or ch.isspace()) for ch in p))


def _literal_ids(tokenizer, text: str, controls: list[str]) -> list[int]:
    """Ids of `text` with every added token's text and turn marker (`controls`) read as ordinary characters: special
    tokens through split_special_tokens, the others by tokenizing each occurrence one character at a time (no single
    character forms a multi-character added token). Linear in the text: the pieces between occurrences go to the tokenizer in
    one batch, and each added token's spelling is tokenized once (a tool result of 100 KB of '<tool_call>x' took
    3 s one piece at a time)."""
    hits = []  # (start, -length, text) of every occurrence of every added token's text: one scan a token
    for c in controls:
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
    the message holds an added token's text and the template does not write the message as it is (then its text
    cannot be told from the template's markers)."""
    added = _control_texts(tokenizer)
    controls = added + (_marker_texts(tokenizer, role, added) if templated else [])
    if not any(s in message for s in controls):
        return _ids(tokenizer, templated_env_text(tokenizer, role, message, policy_ended_with_eos) if templated
                    else message)
    if not templated:
        return _literal_ids(tokenizer, message, controls)
    full = templated_env_text(tokenizer, role, message, policy_ended_with_eos)
    before, found, after = templated_env_text(tokenizer, role, _CONTENT, policy_ended_with_eos).partition(_CONTENT)
    if not found or full != before + message + after:
        if not any(s in message for s in added):  # plain-text markers only: the template's text as it writes it
            return _ids(tokenizer, full)
        raise ValueError(f"an environment message with a special token's text, under role {role!r}: the chat "
                         "template does not write it as it is, so its text cannot be kept apart from the markers")
    return _ids(tokenizer, before) + _literal_ids(tokenizer, message, controls) + _ids(tokenizer, after)
