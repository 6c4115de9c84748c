"""How text becomes token ids: one rule, used wherever a prompt is tokenized (the sampler in training and
evaluation, `grpo eval`, the prompt-length check, the warm-up, the benchmark, the reward model).

    plain text        `tokenizer(text)`: the special tokens the tokenizer adds, as at inference (`generate`,
                      vLLM): BOS for Llama / Gemma / Mistral-style tokenizers, nothing for Qwen-style ones
    templated text    `tokenizer(text, add_special_tokens=False)`: a chat template already wrote BOS and the
                      turn markers, so the ids equal `apply_chat_template(messages, tokenize=True)`

Two guards on plain text, both no-ops for ordinary prompts:
  - text that already begins with the BOS token (a chat template rendered into a data file) keeps one BOS,
    not two;
  - a prompt to be continued (`for_generation=True`) drops an EOS the tokenizer appended (`add_eos_token`):
    a prompt that ends the sequence cannot be continued.
"""

from __future__ import annotations

from collections.abc import Sequence

from grpo.types import Prompt

__all__ = ["prompt_token_ids", "text_token_ids"]


def text_token_ids(tokenizer, texts: Sequence[str], templated: Sequence[bool] | bool = False, *,
                   for_generation: bool = True, **kwargs) -> list[list[int]]:
    """Token ids of each text under the rule above; `templated[i]` says whether texts[i] came out of a chat
    template. `kwargs` go to the tokenizer call (e.g. truncation=True, max_length=...)."""
    flags = [templated] * len(texts) if isinstance(templated, bool) else list(templated)
    if len(flags) != len(texts):
        raise ValueError(f"text_token_ids: {len(texts)} texts but {len(flags)} templated flags")
    out: list[list[int] | None] = [None] * len(texts)
    for flag in (False, True):
        idx = [i for i, f in enumerate(flags) if f == flag]
        if not idx:
            continue
        enc = tokenizer([texts[i] for i in idx], add_special_tokens=not flag, **kwargs)["input_ids"]
        for i, ids in zip(idx, enc):
            out[i] = list(ids) if flag else _plain_guards(tokenizer, list(ids), for_generation)
    return out


def prompt_token_ids(tokenizer, prompts: Sequence[Prompt]) -> list[list[int]]:
    """Token ids of each prompt as the policy is fed it (`Prompt.templated` chooses the rule)."""
    return text_token_ids(tokenizer, [p.text for p in prompts], [p.templated for p in prompts])


def _plain_guards(tokenizer, ids: list[int], for_generation: bool) -> list[int]:
    bos, eos = getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None)
    if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]  # the text began with BOS itself
    if for_generation and eos is not None and eos != bos and len(ids) >= 2 and ids[-1] == eos:
        ids = ids[:-1]  # appended by the tokenizer (add_eos_token); a prompt must leave the sequence open
    return ids
