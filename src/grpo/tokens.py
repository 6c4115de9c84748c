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

Messages become text through `apply_chat_template`, which names the row, the model and the template's file when the
template fails on them (ChatTemplateError), instead of jinja's traceback.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from grpo.errors import ChatTemplateError
from grpo.types import Prompt

__all__ = ["apply_chat_template", "prompt_token_ids", "template_file", "text_token_ids"]


def apply_chat_template(tokenizer, messages: list[dict], where: str, **kwargs) -> str:
    """`tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)`. A template that fails on them (its own
    `raise_exception(...)`, a syntax error, a name it lacks, a role it cannot render) is one ChatTemplateError naming
    the model directory, the template's file, `where` (the row: 'train.jsonl line 5') and jinja's message, instead
    of jinja's traceback; other errors pass as they are."""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    except Exception as e:
        if not _from_template(e):
            raise
        line = getattr(e, "lineno", None)
        at = f" (line {line} of the template)" if isinstance(line, int) and line > 0 else ""
        words = getattr(e, "message", None) or str(e) or type(e).__name__
        name = str(getattr(tokenizer, "name_or_path", "") or "") or "(in memory)"
        fix = ("the template does not parse: fix it" if type(e).__name__ == "TemplateSyntaxError" else
               "fix the row's messages (their roles and order) or the template")
        raise ChatTemplateError(f"the chat template of the model {name} ({template_file(tokenizer)}) fails on "
                                f"{where}: {words}{at} [{type(e).__name__}]; {fix}") from e


def template_file(tokenizer) -> str:
    """The file a tokenizer's chat template was read from: chat_template.jinja, chat_template.json, or the
    'chat_template' of tokenizer_config.json in its directory; 'set in memory' when none holds it."""
    root = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    if str(root) and root.is_dir():
        for name in ("chat_template.jinja", "chat_template.json"):
            if (root / name).is_file():
                return str(root / name)
        config = root / "tokenizer_config.json"
        try:
            if "chat_template" in json.loads(config.read_text(encoding="utf-8")):
                return f"{config}, its 'chat_template'"
        except (OSError, ValueError):
            pass
    return "its template set in memory"


def _from_template(err: BaseException) -> bool:
    """Whether `err` is jinja's (TemplateError and its kinds) or was raised by the template's own code (its frames
    are compiled from '<template>'), not by the caller."""
    if any(c.__module__.startswith("jinja2") for c in type(err).__mro__):
        return True
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            return True
        tb = tb.tb_next
    return False


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
