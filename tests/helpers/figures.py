"""The machinery of tests/test_figures.py: read a value out of a results file by a short path, render a doc's
sentence or table row from those values with the doc's own rounding, and find it in the doc.

A figure is the doc's text with each number replaced by a `str.format` field that reads it from the file:

    "{runs[0].step_s:.3f} s"                  a JSON path: keys joined by dots, [i] an index, [a:b] a slice,
                                              [key=value] the list items whose key is value; a key met on a list
                                              maps over it ("results[config=dapo].after": every dapo seed's after)
    "{pm(results.after):+.4f}"                a function of a path (FUNCTIONS: mean, std, pm = 'mean ± std', ...)
    "{wall_s!d}"                              !d: a duration as grpo prints it ('1 min 08 s'); !m, !k: the
                                              value in millions, thousands ('{params!m:.1f} M'); !M: seconds
                                              in minutes, !B: bytes in MiB, !u: upper case
    "{ratio:.1f}x"                            a derived value: a function of the whole file, given with the figure
    "{settings['eval.n']}"                    ['key']: a key that holds dots

The format spec is the rounding the doc shows, so a doc number that differs from its file by more than that
rounding does not render to the doc's text.
"""

from __future__ import annotations

import json
import re
import statistics
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEGMENT = re.compile(r"\[([^\]]*)\]|\.?([^.\[\]]+)")
QUOTED = re.compile(r"'(.*)'")


@cache
def load(path: str):
    """A results file (JSON), by its path from the repository root."""
    return json.loads((ROOT / path).read_text())


def resolve(data, path: str):
    """The value at `path` in `data` (see the module docstring for the path syntax)."""
    value, pos = data, 0
    for m in SEGMENT.finditer(path):
        if m.start() != pos:
            raise ValueError(f"bad path {path!r} at {pos}")
        pos = m.end()
        index, key = m.groups()
        if key is not None:
            value = [item[key] for item in value] if isinstance(value, list) else value[key]
        elif QUOTED.fullmatch(index):  # ['a.b']: a key that holds dots
            value = value[QUOTED.fullmatch(index)[1]]
        elif "=" in index:
            k, v = index.split("=", 1)
            value = [item for item in value if str(item[k]) == v]
            if not value:
                raise KeyError(f"no item with {k}={v} in {path!r}")
        elif ":" in index:
            a, b = (int(x) if x else None for x in index.split(":", 1))
            value = value[a:b]
        else:
            value = value[int(index)]
    if pos != len(path):
        raise ValueError(f"bad path {path!r} at {pos}")
    return value


@dataclass(frozen=True)
class Spread:
    """'mean ± std' of some values, both with the format spec's precision (the spread without its sign)."""
    mean: float
    std: float

    def __format__(self, spec: str) -> str:
        return f"{self.mean:{spec}} ± {self.std:{spec.lstrip('+')}}"


FUNCTIONS: dict[str, Callable] = {
    "mean": statistics.mean, "std": statistics.stdev, "pstd": statistics.pstdev, "max": max, "min": min,
    "sum": sum, "len": len,
    "pm": lambda v: Spread(statistics.mean(v), statistics.stdev(v)),       # sample std, as the bench tables
    "ppm": lambda v: Spread(statistics.mean(v), statistics.pstdev(v)),     # population std
}


def duration(seconds: float) -> str:
    """A duration as grpo prints it, which is how the docs quote it ('1 min 08 s')."""
    from grpo.tracking.progress import format_duration

    return format_duration(seconds)


CONVERSIONS: dict[str, Callable] = {
    "d": lambda seconds: duration(seconds),   # '1 min 08 s'
    "m": lambda n: n / 1e6,                   # millions: '{params!m:.1f} M'
    "k": lambda n: n / 1e3,                   # thousands: '{peak_mb!k:.1f} GB'
    "M": lambda seconds: seconds / 60,        # minutes: '{wall_s!M:.0f} min'
    "B": lambda n: n / 2**20,                 # bytes in MiB: '{model_state_bytes!B:.2f} MiB'
    "u": lambda text: str(text).upper(),      # 'cpu' -> 'CPU'
}


class _Renderer(string.Formatter):
    def __init__(self, data, derived: dict[str, Callable]):
        self.data, self.derived = data, derived

    def value(self, expr: str):
        name, rest = re.match(r"(\w*)(.*)", expr).groups()
        if name in self.derived:  # a derived value, or a path into it ('{yes[0]}')
            return resolve(self.derived[name](self.data), rest.lstrip("."))
        call = re.fullmatch(r"(\w+)\((.+)\)", expr)
        if call:
            return FUNCTIONS[call[1]](self.value(call[2]))
        return resolve(self.data, expr)

    def get_field(self, field_name, args, kwargs):
        return self.value(field_name), field_name

    def convert_field(self, value, conversion):
        if conversion in CONVERSIONS:
            return CONVERSIONS[conversion](value)
        return super().convert_field(value, conversion)


@dataclass(frozen=True)
class Figure:
    """One quoted figure (or a sentence or table row holding several): `text` rendered from `source`, in `doc`.
    `each`: a path to a list; the text is then rendered once per item, from the item."""
    doc: str
    source: str
    text: str
    each: str | None = None
    derived: dict[str, Callable] = field(default_factory=dict)

    def rendered(self) -> list[str]:
        data = load(self.source)
        items = resolve(data, self.each) if self.each else [data]
        return [_Renderer(item, self.derived).format(self.text) for item in items]

    @property
    def id(self) -> str:
        return f"{self.doc}: {Path(self.source).name}: {self.text[:50]}"


def F(doc: str, source: str, text: str, each: str | None = None, **derived: Callable) -> Figure:
    return Figure(doc, source, text, each, derived)


def normalized(text: str) -> str:
    return " ".join(text.split())


def sections(doc_text: str) -> list[str]:
    """The doc cut at its markdown headings (lines starting with '#' outside code fences), each normalized."""
    out, current, fenced = [], [], False
    for line in doc_text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if line.startswith("#") and not fenced:
            out.append(normalized("\n".join(current)))
            current = []
        current.append(line)
    out.append(normalized("\n".join(current)))
    return out


def names_source(section: str, doc: str, source: str) -> bool:
    """The section names the results file: by its path from the repository root or from the doc's folder."""
    relative = Path(source).relative_to(Path(doc).parent) if source.startswith(str(Path(doc).parent)) else None
    return source in section or (relative is not None and str(relative) in section)


def closest(doc: str, wanted: str) -> str:
    """The doc's passage that shares the longest start with `wanted` (for the failure message)."""
    best = ""
    for n in range(len(wanted), 0, -1):
        at = doc.find(wanted[:n])
        if at >= 0:
            best = doc[at:at + len(wanted) + 20]
            break
    return best
