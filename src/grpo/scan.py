"""Linear-time scanning of text the policy wrote: tagged spans and fenced code blocks.

A policy being trained is an adversary of every parser of its text: a regex such as `<tool_call>\\s*(.*?)\\s*
</tool_call>` backtracks on a turn of `<tool_call>` and spaces (11 s for 3.2 KB, growing ~n^2.2), and a code-fence
regex on a fence followed by 32k spaces holds the GIL for seconds. These scanners use str.find only: each character
is looked at a bounded number of times, whatever the input (tests/rewards/test_linear_parsers.py feeds 100 KB of
the worst patterns).

    between("a<x>1</x>b<x>2</x>", "<x>", "</x>")       -> ["1", "2"]
    fenced_blocks("```python\\nprint(1)\\n```")          -> [("python", "print(1)\\n")]
"""

from __future__ import annotations

__all__ = ["between", "fenced_blocks", "spans"]

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def spans(text: str, open_tag: str, close_tag: str, *, case: bool = True) -> list[tuple[int, int]]:
    """(start, end) of the content of each `open_tag` ... `close_tag` pair, left to right, not overlapping: the
    content runs from after an opening tag to the first closing tag after it; an opening tag without a closing one
    ends the scan. case=False matches the tags' ASCII letters in any case."""
    # ASCII letters only: str.lower() changes some strings' length ('İ' -> 'i̇'), which would shift every index after
    # it, and the tags are ASCII
    hay = text if case else text.translate(_ASCII_LOWER)
    o, c = (open_tag, close_tag) if case else (open_tag.translate(_ASCII_LOWER), close_tag.translate(_ASCII_LOWER))
    out, pos = [], 0
    while True:
        i = hay.find(o, pos)
        if i < 0:
            return out
        j = hay.find(c, i + len(o))
        if j < 0:
            return out
        out.append((i + len(o), j))
        pos = j + len(c)


def between(text: str, open_tag: str, close_tag: str, *, case: bool = True) -> list[str]:
    """The contents of each `open_tag` ... `close_tag` pair (see spans)."""
    return [text[a:b] for a, b in spans(text, open_tag, close_tag, case=case)]


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info string lower-cased, body) of each ``` fenced block: an opening fence, the rest of its line as the info
    string (stripped), then the body up to the next ``` (a block without a closing fence is not a block)."""
    out, pos = [], 0
    while True:
        i = text.find("```", pos)
        if i < 0:
            return out
        eol = text.find("\n", i + 3)
        if eol < 0:
            return out
        j = text.find("```", eol + 1)
        if j < 0:
            return out
        out.append((text[i + 3:eol].strip().lower(), text[eol + 1:j]))
        pos = j + 3
