"""Checks of a local data set file before (and after) `datasets` reads it, so a bad file fails with one message
naming the file and the line, instead of a pyarrow traceback or a silently changed value.

    check_file(path, builder, shown)      raises DataFileError, or returns: the file is fit to read
    explain_failure(path, builder, shown, exc) -> DataFileError   why `datasets` could not read it

What is checked (JSON and JSON-lines files line by line, streaming; CSV only when pandas fails; Parquet by
`datasets` alone, whose message is then given with the file's name):
- an empty file, or one with only blank lines;
- compressed content (gzip, bzip2, xz, zip: read through, so a cut-off archive names the line it reached; zstd is
  left to `datasets`);
- bytes that are not UTF-8, with the line and column;
- a line that is not valid JSON, saying when it is the file's last line without a newline (cut off);
- a row that is not a JSON object (an array, a string, a number);
- NaN / Infinity (not JSON), and a key given twice in one row;
- one column holding text in some rows and numbers (or booleans) in others: `datasets` would silently turn
  "007" into 7 or fail, so the row and the first row of the other type are named.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from grpo.data.tables import array_lines
from grpo.errors import DataFileError

__all__ = ["COMPRESSED_SUFFIXES", "check_file", "compression_of", "explain_failure"]

MAGIC = [(b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"),
         (b"PK\x03\x04", "zip")]
COMPRESSED_SUFFIXES = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd", ".zip": "zip"}


def compression_of(path: Path) -> str | None:
    """'gzip', 'bzip2', 'xz', 'zstd' or 'zip' when the file starts with that format's magic bytes, else None."""
    head = _read_head(path)
    return next((name for magic, name in MAGIC if head.startswith(magic)), None)


def _read_head(path: Path) -> bytes:
    """The first 8 bytes of the file (OSError when it cannot be read)."""
    with open(path, "rb") as f:
        return f.read(8)


def _open(path: Path, compression: str | None) -> IO[bytes]:
    if compression == "gzip":
        return gzip.open(path, "rb")
    if compression == "bzip2":
        return bz2.open(path, "rb")
    if compression == "xz":
        return lzma.open(path, "rb")
    if compression == "zip":
        archive = zipfile.ZipFile(path)
        names = [n for n in archive.namelist() if not n.endswith("/")]
        if len(names) != 1:
            raise ValueError(f"a zip archive must hold exactly one file, this one holds {len(names)}")
        return archive.open(names[0])
    return open(path, "rb")


def check_file(path: Path, builder: str, shown: str) -> None:
    """Raise DataFileError naming `shown` (the file as the user gave it) and the line when the file cannot be
    read as `builder` ('json', 'csv' or 'parquet') without loss; return when it can."""
    try:
        _read_head(path)
    except OSError as e:  # no permission, a broken mount: one message, not a traceback
        raise DataFileError(f"{shown}: cannot be read ({type(e).__name__}: {e.strerror or e}); check that the file "
                            "is readable by this user") from None
    if path.stat().st_size == 0:
        raise DataFileError(f"{shown}: the file is empty (0 bytes); a data set file needs one row per line "
                            "(JSONL), a header and rows (CSV), or a Parquet table")
    compression = compression_of(path)
    if builder == "parquet":
        if compression is not None:
            raise DataFileError(f"{shown}: the file is {compression}-compressed, not a Parquet file; decompress it")
        return
    if compression == "zstd" or builder != "json":
        return  # CSV is checked by pandas; explain_failure names the line of an encoding error
    try:
        with _open(path, compression) as f:
            _check_json(f, shown, compression)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, lzma.LZMAError) as e:  # the archive itself is bad
        if isinstance(e, DataFileError):
            raise
        raise DataFileError(f"{shown}: the {compression or 'file'} content cannot be read: {type(e).__name__}: {e}"
                            + ("; the archive is probably cut off (an interrupted copy or download?)"
                               if isinstance(e, EOFError) else "")) from None


def explain_failure(path: Path, builder: str, shown: str, exc: BaseException) -> DataFileError:
    """The DataFileError for a file `datasets` failed to read: the line of an encoding error (CSV), else the
    library's own message with the file's name."""
    if builder == "csv":
        compression = compression_of(path)
        if compression not in ("zstd",):
            try:
                with _open(path, compression) as f:
                    for number, line in enumerate(f, 1):
                        _decode(line, number, shown)
            except DataFileError as e:
                return e
            except (OSError, EOFError, ValueError, zipfile.BadZipFile, lzma.LZMAError):
                pass
    cause = exc.__cause__ or exc.__context__ or exc
    detail = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
    if cause is not exc and str(exc):
        detail = f"{type(exc).__name__}: {exc} ({detail})"
    return DataFileError(f"{shown}: cannot read it as {builder}: {detail}")


# ------------------------------------------------------------------------------------------------ JSON


class _Keys:
    """The scalar type of each top-level key, and the first line that had it."""

    def __init__(self, shown: str) -> None:
        self.shown, self.seen = shown, {}  # key -> (kind, where)

    def check(self, row: dict, where: str) -> None:
        for key, value in row.items():
            kind = _kind(value)
            if kind is None:
                continue
            first = self.seen.setdefault(key, (kind, where))
            if first[0] != kind:
                raise DataFileError(
                    f"{self.shown} {where}: column {key!r} is {kind} here ({_short(value)}) but {first[0]} on "
                    f"{first[1]}; give a column one type in every row (e.g. write numbers as text: \"7\"), "
                    "otherwise values change silently (\"007\" would become 7)")


def _kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    return None  # null, lists and objects are not compared


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (use null for no value)")


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice in one row")
        out[key] = value
    return out


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_not_json, object_pairs_hook=_pairs)


def _decode(line: bytes, number: int, shown: str) -> str:
    try:
        return line.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise DataFileError(f"{shown} line {number}: not UTF-8 text (byte 0x{line[e.start]:02x} at column "
                            f"{e.start + 1}); save the file as UTF-8") from None


def _lines(f: IO[bytes], shown: str) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, ends with a newline) of each line."""
    for number, line in enumerate(f, 1):
        yield number, _decode(line, number, shown), line.endswith(b"\n")


def _check_json(f: IO[bytes], shown: str, compression: str | None, lines_only: bool = False) -> None:
    """A JSON array of objects, or JSON lines (one object per line); lines_only: JSON lines (a file that starts with
    "[" but is not one array: its first row is an array, named as such, not as "Extra data")."""
    buffered = f if hasattr(f, "peek") else io.BufferedReader(f)
    head = buffered.peek(64)[:64].lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(b"[") and not lines_only:
        _check_json_array(buffered.read(), shown)
        return
    keys, rows = _Keys(shown), 0
    for number, text, newline in _lines(buffered, shown):
        if not text.strip():
            continue
        try:
            row = _loads(text)
        except ValueError as e:
            if rows == 0 and text.lstrip().startswith("{") and _is_document(text, buffered):
                return  # one JSON object over several lines ({"prompt": [...], "answer": [...]}): columns
            raise DataFileError(_bad_json_line(shown, number, text, newline, e)) from None
        if not isinstance(row, dict):
            raise DataFileError(f"{shown} line {number}: {_what(row)}, expected an object such as "
                                '{"prompt": "...", "answer": "..."} (JSON lines: one object per line)')
        keys.check(row, f"line {number}")
        rows += 1
    if rows == 0:
        raise DataFileError(f"{shown}: no rows (only blank lines"
                            + (f" in its {compression} content" if compression else "") + ")")


def _is_document(first: str, rest: IO[bytes]) -> bool:
    """Whether `first` and the rest of the file are one JSON object (a columnar file)."""
    try:
        return isinstance(_loads(first + rest.read().decode("utf-8")), dict)
    except ValueError:
        return False


def _bad_json_line(shown: str, number: int, text: str, newline: bool, e: ValueError) -> str:
    where = f"{shown} line {number}"
    if not isinstance(e, json.JSONDecodeError):
        return f"{where}: {e}"
    detail = _where_in_line(e)
    if not newline:
        return (f"{where}: the last line is not complete JSON ({detail}): the file ends in the middle of a row, so "
                "it was probably cut off (an interrupted write or copy); complete or delete that line")
    return f"{where}: not valid JSON ({detail}); each line must be one complete JSON object"


def _where_in_line(e: json.JSONDecodeError) -> str:
    """'Expecting value at column 5', 'Unterminated string starting at column 13'."""
    return f"{e.msg}{'' if e.msg.endswith(' at') else ' at'} column {e.colno}"


def _what(value: Any) -> str:
    if isinstance(value, list):
        return "a JSON array"
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string"}.get(type(value), "a value")


def _check_json_array(data: bytes, shown: str) -> None:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataFileError(f"{shown} line {line}: not UTF-8 text (byte 0x{data[e.start]:02x}); save the file as "
                            "UTF-8") from None
    try:
        rows = _loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # not one array but JSON lines whose first row is an array: name that row
            _check_json(io.BufferedReader(io.BytesIO(data)), shown, None, lines_only=True)
        cut = e.lineno >= text.rstrip().count("\n") + 1  # on the last line: the file ends inside the array
        raise DataFileError(f"{shown} line {e.lineno}: not valid JSON ({_where_in_line(e)})"
                            + ("; the file ends in the middle of the array, so it was probably cut off" if cut
                               else "")) from None
    except ValueError as e:
        raise DataFileError(f"{shown}: {e}") from None
    if not rows:
        raise DataFileError(f"{shown}: no rows (an empty JSON array)")
    keys, lines = _Keys(shown), array_lines(text)
    for line, row in zip(lines, rows):
        if not isinstance(row, dict):
            raise DataFileError(f"{shown} line {line}: {_what(row)} in the array, expected an object such as "
                                '{"prompt": "...", "answer": "..."}')
        keys.check(row, f"line {line}")
