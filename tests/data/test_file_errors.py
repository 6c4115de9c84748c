"""Bad data set files (grpo.data.file_checks through grpo.data.files): each is one DataFileError (a UserError) naming
the file and, where there is one, the line; compressed files load; and a property test feeds mutated files and
accepts only a clean load or a DataFileError."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo.data.files import DataFileError, FileTask
from grpo.errors import UserError

ROWS = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(12)]
GOOD = "".join(json.dumps(r) + "\n" for r in ROWS).encode()


@pytest.fixture(autouse=True)
def _private_datasets_cache(tmp_path, monkeypatch):
    """`datasets` caches every file it reads: keep the cache of these tests in tmp_path."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def load(path: Path, **kw) -> FileTask:
    kw.setdefault("reward_functions", ["exact_answer"])
    kw.setdefault("test_fraction", 0.3)
    return FileTask(str(path), **kw)


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def error_of(path: Path, **kw) -> str:
    with pytest.raises(DataFileError) as e:
        load(path, **kw)
    assert isinstance(e.value, UserError) and isinstance(e.value, ValueError)
    return str(e.value)


def line_of(data: bytes, needle: bytes) -> int:
    """The 1-based line number of the first line holding `needle` (an independent count)."""
    return next(i for i, line in enumerate(data.split(b"\n"), 1) if needle in line)


def test_bytes_that_are_not_utf8_name_the_file_the_line_and_the_byte(tmp_path):
    data = GOOD.replace(b"What is 4 + 1?", b"What is 4 \xff 1?")
    msg = error_of(write(tmp_path, "latin.jsonl", data))
    col = data.split(b"\n")[4].index(b"\xff") + 1
    assert f"latin.jsonl line 5: not UTF-8 text (byte 0xff at column {col})" in msg and "UTF-8" in msg


def test_a_cut_off_last_line_is_named_as_cut_off(tmp_path):
    data = GOOD[:-12]  # a copy interrupted in the middle of the last row
    msg = error_of(write(tmp_path, "cut.jsonl", data))
    assert "cut.jsonl line 12: the last line is not complete JSON" in msg and "cut off" in msg


def test_a_broken_line_in_the_middle_is_named(tmp_path):
    lines = GOOD.split(b"\n")
    lines[6] = lines[6][:20]
    msg = error_of(write(tmp_path, "mid.jsonl", b"\n".join(lines)))
    assert "mid.jsonl line 7: not valid JSON" in msg and "one complete JSON object" in msg


@pytest.mark.parametrize(("data", "words"), [
    (b"", "the file is empty (0 bytes)"),
    (b"\n\n  \n", "no rows (only blank lines)"),
    (b"[]", "no rows (an empty JSON array)"),
])
def test_empty_files_say_so(tmp_path, data, words):
    assert words in error_of(write(tmp_path, "empty.jsonl", data))


@pytest.mark.parametrize(("row", "what"), [(b"[1, 2]", "a JSON array"), (b'"just text"', "a string"),
                                           (b"42", "a number"), (b"null", "null")])
def test_a_row_that_is_not_an_object_names_its_line(tmp_path, row, what):
    data = GOOD + row + b"\n"
    msg = error_of(write(tmp_path, "shape.jsonl", data))
    assert f"shape.jsonl line {len(ROWS) + 1}: {what}, expected an object" in msg


def test_a_column_with_text_and_numbers_names_both_lines(tmp_path):
    data = GOOD + b'{"prompt": "What is 6 + 1?", "answer": 7}\n'
    msg = error_of(write(tmp_path, "types.jsonl", data))
    assert f"types.jsonl line {len(ROWS) + 1}: column 'answer' is a number here (7) but text on line 1" in msg


def test_nan_and_duplicate_keys_are_not_json_rows(tmp_path):
    nan = GOOD + b'{"prompt": "q", "answer": NaN}\n'
    assert "line 13: NaN is not JSON" in error_of(write(tmp_path, "nan.jsonl", nan))
    dup = GOOD + b'{"prompt": "q", "prompt": "r", "answer": "1"}\n'
    assert "line 13: key 'prompt' appears twice" in error_of(write(tmp_path, "dup.jsonl", dup))


def test_a_json_array_file_loads_and_a_cut_one_names_the_line(tmp_path):
    data = json.dumps(ROWS, indent=1).encode()
    t = load(write(tmp_path, "rows.json", data))
    assert len(t.split("train", 99)) + len(t.split("test", 99)) == len(ROWS)
    msg = error_of(write(tmp_path, "cut.json", data[:-30]))
    assert "cut.json line" in msg and "cut off" in msg
    mixed = write(tmp_path, "mixed.json", b'[{"prompt": "q"},\n {"prompt": "r"},\n\n 3]')
    assert "mixed.json line 4: a number in the array" in error_of(mixed)  # the line an editor shows


@pytest.mark.parametrize(("name", "compress"), [("d.jsonl.gz", gzip.compress), ("d.jsonl", gzip.compress),
                                                ("d.jsonl.bz2", bz2.compress), ("d.jsonl.xz", lzma.compress)])
def test_compressed_files_load(tmp_path, name, compress):
    t = load(write(tmp_path, name, compress(GOOD)))
    texts = {p.text for p in t.split("train", 99) + t.split("test", 99)}
    assert texts == {r["prompt"] for r in ROWS}


def test_compressed_files_are_checked_inside_and_a_cut_archive_says_so(tmp_path):
    bad = GOOD.replace(b"What is 2 + 1?", b"What is 2 \xfe 1?")
    assert "d.jsonl.gz line 3: not UTF-8 text" in error_of(write(tmp_path, "d.jsonl.gz", gzip.compress(bad)))
    msg = error_of(write(tmp_path, "cut.jsonl.gz", gzip.compress(GOOD)[:-25]))
    assert "cut.jsonl.gz: the gzip content cannot be read" in msg and "cut off" in msg


def test_csv_encoding_errors_name_the_line_and_parquet_garbage_names_the_file(tmp_path):
    csv = b"prompt,answer\nWhat is 1 + 1?,2\nWhat is 2 \xff 1?,3\n"
    assert "bad.csv line 3: not UTF-8 text" in error_of(write(tmp_path, "bad.csv", csv))
    msg = error_of(write(tmp_path, "bad.parquet", b"PAR1 this is not parquet"))
    assert "bad.parquet: cannot read it as parquet" in msg
    assert "gzip-compressed, not a Parquet file" in error_of(write(tmp_path, "z.parquet", gzip.compress(b"x" * 50)))


# ------------------------------------------------------------------------------------------ property test


def _mutations():
    """(name, mutate(bytes) -> bytes) strategies: the damage a careless user or an interrupted copy does."""
    cut = st.integers(0, len(GOOD)).map(lambda k: ("cut", lambda b: b[:k]))
    insert = st.tuples(st.integers(0, len(GOOD)), st.binary(min_size=1, max_size=8)).map(
        lambda t: ("insert", lambda b: b[:t[0]] + t[1] + b[t[0]:]))
    flip = st.tuples(st.integers(0, len(GOOD) - 1), st.integers(0, 255)).map(
        lambda t: ("flip", lambda b: b[:t[0]] + bytes([t[1]]) + b[t[0] + 1:]))
    value = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5),
                      st.lists(st.integers(), max_size=2),
                      st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
    retype = st.tuples(st.integers(0, len(ROWS) - 1), st.sampled_from(["prompt", "answer", "extra"]), value).map(
        lambda t: ("retype", lambda b: _retype(b, *t)))
    noise = st.binary(max_size=200).map(lambda junk: ("noise", lambda b: junk))
    return st.one_of(cut, insert, flip, retype, noise)


def _retype(data: bytes, row: int, key: str, value) -> bytes:
    rows = [json.loads(line) for line in data.decode().splitlines()]
    rows[row][key] = value
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mutation=_mutations(), compressed=st.booleans(), cut_archive=st.integers(0, 30),
       name=st.sampled_from(["d.jsonl", "d.json", "d.jsonl.gz"]))
def test_mutated_files_load_cleanly_or_raise_one_data_file_error(mutation, compressed, cut_archive, name):
    kind, mutate = mutation
    data = mutate(GOOD)
    if compressed or name.endswith(".gz"):
        data = gzip.compress(data)
        if kind == "cut":
            data = data[:max(0, len(data) - cut_archive)]
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp), name, data)
        try:
            t = load(path)
            rows = t.split("train", 99) + t.split("test", 99)
        except DataFileError as e:
            assert path.name in str(e), str(e)  # every message names the file
            return
        assert rows and all(isinstance(p.text, str) and p.text.strip() for p in rows)
