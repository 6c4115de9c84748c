"""Plain data files without the `datasets` extra (grpo.data.tables): JSONL, JSON and CSV read with the standard
library, the same rows `datasets` would give, errors that name the file and the line, and a clear message where
the extra is still needed (Parquet)."""

from __future__ import annotations

import json
import re
import sys

import pytest

from grpo.data.files import DataFileError, FileTask, read_table
from grpo.data.tables import TableError, read_plain

ROWS = [{"prompt": "What is 20 + 9?", "answer": "29"}, {"prompt": "What is 45 - 17?", "answer": "28", "level": 2}]


@pytest.fixture
def no_datasets(monkeypatch):
    """The core install: importing `datasets` fails."""
    monkeypatch.setitem(sys.modules, "datasets", None)


def test_jsonl_json_and_csv_give_the_same_rows(tmp_path):
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "\n")
    (tmp_path / "a.json").write_text(json.dumps(ROWS))
    (tmp_path / "a.csv").write_text('prompt,answer,level\nWhat is 20 + 9?,29,\n"What is 45 - 17?",28,2\n')
    (tmp_path / "a.tsv").write_text("prompt\tanswer\tlevel\nWhat is 20 + 9?\t29\t\nWhat is 45 - 17?\t28\t2\n")
    want = [{"prompt": "What is 20 + 9?", "answer": "29", "level": None},
            {"prompt": "What is 45 - 17?", "answer": "28", "level": 2}]
    for name in ("a.jsonl", "a.json"):
        table = read_plain(tmp_path / name)
        assert table.column_names == ["prompt", "answer", "level"] and list(table) == want and len(table) == 2
    for name in ("a.csv", "a.tsv"):  # a column of integers is int, as datasets/pandas infer it; empty is None
        assert list(read_plain(tmp_path / name)) == [dict(want[0], answer=29), dict(want[1], answer=28)]


def test_the_datasets_reader_agrees_on_jsonl_and_csv(tmp_path):
    datasets = pytest.importorskip("datasets")
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "a.csv").write_text('prompt,answer\nWhat is 20 + 9?,29\nWhat is 45 - 17?,28\n')
    for name, builder in (("a.jsonl", "json"), ("a.csv", "csv")):
        theirs = datasets.load_dataset(builder, data_files=str(tmp_path / name), split="train")
        ours = read_plain(tmp_path / name)
        assert ours.column_names == theirs.column_names and list(ours) == list(theirs)


def test_a_plain_file_trains_without_the_datasets_extra(tmp_path, no_datasets):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"What is {a} + 1?", "answer": str(a + 1)}) + "\n"
                            for a in range(40)))
    task = FileTask(str(path), reward_functions=["exact_answer"], plain_prompts="raw", test_fraction=0.2)
    rows = task.split("train", 100) + task.split("test", 100)
    assert len(rows) == 40 and {p.answer for p in rows} == {str(a + 1) for a in range(40)}


def test_parquet_without_the_extra_says_which_install_reads_it(tmp_path, no_datasets):
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    with pytest.raises(DataFileError, match=r"d\.parquet.*needs the `datasets` package: pip install 'grpo\[data\]' "
                                            r"\(plain JSONL, JSON and CSV files need nothing more\)"):
        read_table(str(tmp_path / "d.parquet"))
    with pytest.raises(DataFileError, match="does not exist"):
        read_table(str(tmp_path / "missing.parquet"))
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(DataFileError, match="unknown file type '.txt'"):
        read_table(str(tmp_path / "notes.txt"))


@pytest.mark.parametrize("name,content,message", [
    ("cut.jsonl", b'{"prompt": "a", "answer": "1"}\n{"prompt": "b", "ans', r"cut\.jsonl line 2: not valid JSON"),
    ("list.jsonl", b'{"prompt": "a", "answer": "1"}\n\n[1, 2]\n', r"list\.jsonl line 3: a JSON list, expected an object"),
    ("latin1.jsonl", b'{"prompt": "a", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "2"}\n',
     r"latin1\.jsonl line 2: not UTF-8 text"),
    ("empty.jsonl", b"\n\n", r"empty\.jsonl: the file has no rows"),
    ("ragged.csv", b"prompt,answer\na,1\nb,2,3\n", r"ragged\.csv line 3: 3 fields, the header has 2"),
    ("header.csv", b"prompt,answer\n", r"header\.csv: the file has a header but no rows"),
    ("scalars.json", b"[1, 2]", r"scalars\.json line 1: an element of the array is a JSON int"),
])
def test_unreadable_files_name_the_file_and_the_line(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(TableError, match=message):
        read_plain(tmp_path / name)
    # through a task: JSON files meet grpo.data.file_checks first (its own words); every message names the file
    with pytest.raises(DataFileError, match=message if name.endswith("csv") else re.escape(name)):
        FileTask(str(tmp_path / name), reward_functions=["exact_answer"])
