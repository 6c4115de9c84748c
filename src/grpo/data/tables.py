"""Plain data set files read with the standard library, so they work after the core install (no `datasets`):

    .jsonl            one JSON object per line (blank lines skipped); lines end at "\n" only, as JSON Lines
                      defines them (a raw U+2028 or U+0085 inside a string is text, not a line break)
    .json             a JSON array of objects, or JSON lines
    .csv / .tsv       a header row, then one row per record, read by the csv module (a quoted field may hold line
                      breaks); a column whose every value is an integer (or a number) written the way Python writes
                      it back becomes int (or float), as `datasets`/pandas infer it, and stays text otherwise, so
                      no value changes ("007", "1.50" and "1e3" stay text); an empty cell is None

A row missing a column gets None there, as `datasets` fills it. `Table.lines` holds the line each row starts on
(1-based, as an editor shows it; a JSON array's element too: `array_lines`). Errors name the file and the line:
bytes that are not UTF-8, a line that is not JSON (cut off), a row that is not an object.
Parquet, `save_to_disk` directories and Hub names still go through `datasets` (grpo.data.files).
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

from grpo.errors import DataFileError

PLAIN_SUFFIXES = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "tsv"}


class TableError(DataFileError):
    """A plain data file that cannot be read; the message names the file and the line."""


class Table:
    """Rows (dicts) and the union of their columns in first-seen order: the part of `datasets.Dataset` that
    grpo.data.files reads (`column_names`, iteration, len)."""

    def __init__(self, rows: list[dict], lines: list[int] | None = None):
        self.lines = lines
        names: dict[str, None] = {}
        for row in rows:
            names.update(dict.fromkeys(row))
        self.column_names = list(names)
        self.rows = [{c: row.get(c) for c in self.column_names} for row in rows]

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


def read_plain(path: Path, shown: str | None = None) -> Table:
    """The Table of a .jsonl, .json, .csv or .tsv file (see the module docstring); errors name the file as `shown`
    (default: the path)."""
    kind = PLAIN_SUFFIXES[path.suffix.lower()]
    shown = shown or str(path)
    text = _text(path, shown)
    if kind == "jsonl":
        return Table(*_json_lines(text, shown))
    if kind == "json":
        return _json_document(text, shown)
    return Table(*_csv_rows(text, shown, "\t" if kind == "tsv" else ","))


def _text(path: Path, shown: str) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise TableError(f"{shown} line {line}: not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start}); "
                         "save the file as UTF-8") from None


def _json_lines(text: str, shown: str) -> tuple[list[dict], list[int]]:
    """(rows, the line of each row): lines split at "\n" only (str.splitlines would also split at U+2028, U+0085,
    form feeds... which JSON allows raw inside a string)."""
    rows, lines = [], []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise TableError(f"{shown} line {number}: not valid JSON ({e}): {line[:80]!r}") from None
        if not isinstance(row, dict):
            raise TableError(f"{shown} line {number}: a JSON {type(row).__name__}, expected an object "
                             '({"prompt": ..., "answer": ...})')
        rows.append(row)
        lines.append(number)
    if not rows:
        raise TableError(f"{shown}: the file has no rows")
    return rows, lines


def _json_document(text: str, shown: str) -> Table:
    try:
        value = json.loads(text)
    except ValueError:
        return Table(*_json_lines(text, shown))  # JSON lines under a .json name
    if isinstance(value, dict):
        return Table(*_json_lines(text, shown))  # one object: a one-line JSONL file
    if not isinstance(value, list) or not value:
        raise TableError(f"{shown}: expected a JSON array of row objects (or JSON lines), got "
                         f"{'an empty array' if value == [] else type(value).__name__}")
    lines = array_lines(text)
    for i, row in enumerate(value):
        if not isinstance(row, dict):
            raise TableError(f"{shown} line {lines[i]}: an element of the array is a JSON {type(row).__name__}, "
                             "not an object")
    return Table(value, lines)


_SPACE = re.compile(r"[ \t\n\r]*")


def array_lines(text: str) -> list[int]:
    """The line (1-based, as an editor shows it) on which each element of the JSON array `text` starts, so a row
    of a .json file is named like a row of a .jsonl file. `text` is valid JSON (a leading BOM is skipped)."""
    decoder, lines = json.JSONDecoder(), []
    i = _SPACE.match(text, 1 if text.startswith("\ufeff") else 0).end() + 1  # past "["
    line, counted = 1, 0
    while True:
        i = _SPACE.match(text, i).end()
        if i >= len(text) or text[i] == "]":
            return lines
        line, counted = line + text.count("\n", counted, i), i
        lines.append(line)
        _, i = decoder.raw_decode(text, i)
        i = _SPACE.match(text, i).end()
        if i < len(text) and text[i] == ",":
            i += 1


def _csv_rows(text: str, shown: str, delimiter: str) -> tuple[list[dict], list[int]]:
    """(rows, the line each starts on). The csv module splits records (newline="": its own rules, "\r\n", "\n" or
    "\r"; a line break inside quotes is part of the field); str.splitlines would also break at U+2028/U+0085."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header = next(reader)
    except StopIteration:
        raise TableError(f"{shown}: the file is empty (no header row)") from None
    if len(set(header)) != len(header) or not all(h.strip() for h in header):
        raise TableError(f"{shown} line 1 (the header): needs distinct, non-empty column names, got {header}")
    rows, lines = [], []
    start = reader.line_num + 1  # the line the next row starts on (a quoted field may run over several)
    for values in reader:
        if any(v.strip() for v in values) and len(values) != len(header):
            raise TableError(_field_count_message(shown, header, values, start, reader.line_num))
        if any(v.strip() for v in values):
            rows.append({h: (v if v != "" else None) for h, v in zip(header, values)})
            lines.append(start)
        start = reader.line_num + 1
    if not rows:
        raise TableError(f"{shown}: the file has a header but no rows")
    for column in header:
        _infer_numbers(rows, column)
    return rows, lines


def _field_count_message(shown: str, header: list[str], values: list[str], start: int, end: int) -> str:
    """A row with the wrong number of fields, named by the line it starts on; a row running over several lines
    is a quoted field left open there (the reader takes every line up to the next quote as that one field)."""
    message = f"{shown} line {start}: {len(values)} fields, the header has {len(header)} ({header})"
    if end > start:
        message += (f"; a quoted field opens on line {start} and runs to line {end}: close its quote (a quote "
                    'inside a field is written twice: "")')
    return message


def _infer_numbers(rows: list[dict], column: str) -> None:
    """Make `column` int (or float) in every row when all its non-empty cells parse as one and each writes back as
    the same text (so "007" or "1.50" keeps the column as text: the answer is what the file holds)."""
    cells = [r[column] for r in rows if r[column] is not None]
    for kind in (int, float):
        try:
            parsed = [kind(c) for c in cells]
        except ValueError:
            continue
        if any(str(x) != c for x, c in zip(parsed, cells)):
            return
        it = iter(parsed)
        for r in rows:
            if r[column] is not None:
                r[column] = next(it)
        return
