"""rollout.stop: stop strings (vLLM's `SamplingParams.stop`, TRL's `stop_strings`), one rule for every engine.

A row's completion is decoded as the rewards read it (skip_special_tokens). The rule, which the native sampler, the
vLLM engine and multi-turn episodes all apply, and which the tests check against a naive reference:

    k      the fewest tokens of the row whose decoded text holds a stop string
    ids    the first k (the token that completes the stop string is kept: the policy is trained on it); the row
           has finished, it is not truncated
    text   decode(first k) cut before the occurrence that completes first (the smallest end, then the smallest
           start), as vLLM returns it: the reward never sees the stop string or anything after it

Detection in the decode loop (StopScan.hits) is cheap. A stop string can only be completed by a token whose own text
holds its last character (or whose own text is empty or a partial character: looked at too); which tokens can, is
decided once per token id (the decode of that token alone, cached in a (V,) table), so a step costs one table look-up
for the batch. Only the rows whose newest token can decode their newest `window` tokens, window = the longest stop
string's UTF-8 bytes + WINDOW_MARGIN (a token adds at least one byte to the text, so an occurrence the newest token
completes lies inside it), and a hit is confirmed on the row's whole decode before the row stops (a window's edge
never stops a row wrongly). `finish` then applies the rule to each row's whole decode, so a tokenizer whose pieces
decode otherwise alone than in context can only cost tokens sampled past the stop, never another result.
"""

from __future__ import annotations

import re

import torch

WINDOW_MARGIN = 8  # tokens decoded per row and step beyond the longest stop string's bytes


def first_stop(text: str, stops) -> tuple[int, int] | None:
    """(start, end) in `text` of the stop-string occurrence that completes first (the smallest end; of those
    ending there, the smallest start: the longest string), or None."""
    best = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or (i + len(s), i) < best):
            best = (i + len(s), i)
    return None if best is None else (best[1], best[0])


def cut_at_stop(text: str, stops) -> str:
    """The text a reward sees: `text` up to the first stop string (first_stop), or all of it."""
    found = first_stop(text, stops) if stops else None
    return text if found is None else text[:found[0]]


class StopScan:
    """The stop strings of one engine with its tokenizer: `hits` in the decode loop, `finish` on the whole rows."""

    def __init__(self, tokenizer, stops):
        stops = tuple(stops)
        if not stops or not all(isinstance(s, str) and s for s in stops):
            raise ValueError(f"rollout.stop: every stop string must be a non-empty string, got {list(stops)!r}")
        self.tokenizer, self.stops = tokenizer, stops
        self.pattern = re.compile("|".join(re.escape(s) for s in sorted(set(stops), key=len, reverse=True)))
        self.window = max(len(s.encode("utf-8")) for s in stops) + WINDOW_MARGIN
        self._last = {s[-1] for s in stops}
        self._table: torch.Tensor | None = None  # (V,) int8 by token id: 1 can end a stop string, 0 cannot, -1 unseen
        # the windows are decoded in one call of the Rust tokenizer where there is one (a fast tokenizer): a tenth of
        # the time of batch_decode's per-row Python; its text may differ from decode()'s clean-ups, which only
        # matters for a candidate, and every candidate is confirmed with decode() (finish() catches a miss)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._decode_batch = (backend.decode_batch if backend is not None and hasattr(backend, "decode_batch")
                              else tokenizer.batch_decode)

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def hits(self, tokens: torch.Tensor, rows: torch.Tensor, t: int, check: torch.Tensor) -> torch.Tensor:
        """tokens (N, T) of the whole batch, step t just written; rows (B,) the full-batch row of each batch row;
        check (B,) bool: the batch rows to look at (live, not ended by EOS). Returns (B,) bool on tokens' device:
        the rows whose text holds a stop string now (their token t completes it). Decodes check's rows' newest
        `window` tokens; a hit when the window is not the whole completion is confirmed on the whole decode."""
        out = torch.zeros_like(check)
        idx = (check & self._can_end(tokens[rows, t])).nonzero()[:, 0]
        if not idx.numel():
            return out
        lo = max(0, t + 1 - self.window)
        full = rows[idx]
        tails = self._decode_windows(tokens[full, lo:t + 1].tolist())
        for j, text in enumerate(tails):
            if self.pattern.search(text) is not None and (
                    lo == 0 or self.pattern.search(self._decode(tokens[full[j], :t + 1].tolist())) is not None):
                out[idx[j]] = True
        return out

    def _decode_windows(self, windows: list[list[int]]) -> list[str]:
        return self._decode_batch(windows, skip_special_tokens=True)

    def _can_end(self, newest: torch.Tensor) -> torch.Tensor:
        """newest (B,) token ids -> (B,) bool: the token's own text holds the last character of a stop string, or is
        empty (a special token) or a partial character (byte fallback), so it may complete one. Cached by id."""
        size = int(newest.max()) + 1 if newest.numel() else 0
        if self._table is None or size > len(self._table):
            grown = torch.full((max(size, len(self.tokenizer)),), -1, dtype=torch.int8, device=newest.device)
            if self._table is not None:
                grown[:len(self._table)] = self._table
            self._table = grown
        flags = self._table[newest]
        unseen = newest[flags < 0]
        if unseen.numel():
            for i in unseen.unique().tolist():
                piece = self._decode([i])
                self._table[i] = int(not piece or "\ufffd" in piece or any(c in piece for c in self._last))
            flags = self._table[newest]
        return flags > 0

    def finish(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        """The rule on whole rows: tokens (N, T), lengths (N,) as sampled -> (lengths (N,) cut to k where a stop
        string occurs, stopped (N,) bool, texts: N decoded completions cut before their stop string)."""
        rows = [r[:n] for r, n in zip(tokens.tolist(), lengths.tolist())]
        texts = self.tokenizer.batch_decode(rows, skip_special_tokens=True)
        new_lengths, stopped = lengths.clone(), torch.zeros(len(rows), dtype=torch.bool, device=lengths.device)
        for i, (ids, text) in enumerate(zip(rows, texts)):
            if self.pattern.search(text) is None:
                continue
            k = len(ids)  # the loop stopped the row at the token completing it: its prefix one shorter has none
            if k > 1 and self.pattern.search(self._decode(ids[:k - 1])) is not None:
                k = next(j for j in range(1, k + 1) if self.pattern.search(self._decode(ids[:j])) is not None)
                text = self._decode(ids[:k])
            new_lengths[i], stopped[i], texts[i] = k, True, cut_at_stop(text, self.stops)
        return new_lengths, stopped, texts


_LABEL = re.compile(r"\s*([A-Za-z][\w ]{0,23}:)")  # a prompt line's label: "Question:", "Q:", "Problem 3:"


def suggest_stop(prompts: list[str], completions: list[str]) -> tuple[str, int] | None:
    """The stop string that would end completions which run on past their answer (a base model continuing its
    prompt's pattern), and in how many of `completions` (the cut-off ones) it was seen; None when it shows in fewer
    than half. First the prompts' own labels, in order ("Question:" before "Answer:"), when completions write one
    again at the start of a line: the model writes the next question itself; else "\\n", when completions answer on
    a first line and go on to more lines. Linear in the text."""
    need = max(1, (len(completions) + 1) // 2)
    if not completions:
        return None
    labels: list[str] = []
    for p in prompts:
        for line in p.splitlines():
            m = _LABEL.match(line)
            if m and m.group(1) not in labels:
                labels.append(m.group(1))
    for label in labels:
        again = re.compile(r"\n[ \t]*" + re.escape(label))
        seen = sum(again.search(c) is not None for c in completions)
        if seen >= need:
            return label, seen
    seen = sum(bool(c.split("\n", 1)[0].strip()) and "\n" in c and bool(c.split("\n", 1)[1].strip())
               for c in completions)
    return ("\n", seen) if seen >= need else None
