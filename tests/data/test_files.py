"""Data set files as a Task (grpo.data.files): formats, column mapping, chat templates, validation messages
that name the column/row and the file, the held-out split, and the reward-function requirement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.tiny_hf import chat_tokenizer, write_chat_jsonl

from grpo.config import load_config
from grpo.models.builtin import build_tokenizer
from grpo.data import task_from_config
from grpo.data.files import DataFileError, FileTask, hash_fraction


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def task(path, **kw) -> FileTask:
    kw.setdefault("reward_functions", ["exact_answer"])
    return FileTask(str(path), **kw)


def test_conversations_are_rendered_with_the_chat_template_and_columns_reach_meta(tmp_path):
    data = write_chat_jsonl(tmp_path / "d.jsonl", 20, system=True)
    t = task(data, tokenizer=chat_tokenizer(), test_fraction=0.25)
    train, test = t.split("train", 100), t.split("test", 100)
    assert len(train) + len(test) == 20 and train and test
    p = train[0]
    assert p.text.startswith("<|im_start|>system\nAnswer with a number.<|im_end|>\n<|im_start|>user\nWhat is ")
    assert p.text.endswith("<|im_end|>\n<|im_start|>assistant\n")  # add_generation_prompt
    assert isinstance(p.answer, str) and set(p.meta) == {"level"} and p.uid.startswith("d.jsonl:")
    assert t.split("train", 3) == train[:3]  # prefix-stable, fixed order


def test_plain_text_csv_and_parquet_with_column_mapping(tmp_path):
    import pandas as pd

    df = pd.DataFrame({"question": ["What is 2 + 2?", "Name a colour."] * 10, "solution": ["4", "red"] * 10,
                       "source": ["a", "b"] * 10})
    df["question"] = [f"{q} ({i})" for i, q in enumerate(df["question"])]
    df.to_csv(tmp_path / "d.csv", index=False)
    df.to_parquet(tmp_path / "d.parquet")
    for name in ("d.csv", "d.parquet"):
        t = task(tmp_path / name, prompt_column="question", answer_column="solution", test_fraction=0.3)
        rows = t.split("train", 100) + t.split("test", 100)
        assert len(rows) == 20
        p = next(r for r in rows if r.text.startswith("What is 2 + 2?"))
        assert p.answer == "4" and p.meta == {"source": "a", "solution": "4"}  # also under its own name (TRL)


def test_missing_column_names_the_column_and_the_file(tmp_path):
    data = jsonl(tmp_path / "qa.jsonl", [{"question": "hi", "answer": "1"}])
    with pytest.raises(ValueError, match=r"qa\.jsonl: no column 'prompt' \(data\.prompt_column\).*question"):
        task(data)
    with pytest.raises(ValueError, match=r"qa\.jsonl: no column 'gold' \(data\.answer_column\)"):
        task(data, prompt_column="question", answer_column="gold")


@pytest.mark.parametrize("bad,message", [
    ({"prompt": "  ", "answer": "1"}, r"line 3: column 'prompt' \(the prompt\) is empty"),
    ({"prompt": [], "answer": "1"}, r"line 3: column 'prompt' \(the prompt\) is empty"),
    ({"prompt": "q", "answer": None}, r"line 3: column 'answer' \(the answer\) is empty"),
    ({"prompt": [{"role": "user"}], "answer": "1"}, r"line 3: message 1 of column 'prompt'"),
])
def test_bad_rows_name_the_line_and_the_file(tmp_path, bad, message):
    good = {"prompt": [{"role": "user", "content": "q"}], "answer": "1"} if isinstance(bad["prompt"], list) \
        else {"prompt": "q", "answer": "1"}
    data = jsonl(tmp_path / "rows.jsonl", [good, good, bad, good])
    with pytest.raises(ValueError, match=r"rows\.jsonl " + message):
        task(data)


def test_empty_prompts_are_kept_for_the_filter_when_asked(tmp_path):
    data = jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i}" if i != 3 else "", "answer": "1"} for i in range(30)])
    t = task(data, keep_empty=True, test_fraction=0.2)
    assert sum(p.text == "" for p in t.split("train", 100) + t.split("test", 100)) == 1


def test_hash_split_is_deterministic_disjoint_and_keeps_duplicates_together(tmp_path):
    rows = [{"prompt": f"question {i % 40}", "answer": str(i)} for i in range(80)]  # every prompt twice
    data = jsonl(tmp_path / "d.jsonl", rows)
    a, b = task(data, test_fraction=0.25), task(data, test_fraction=0.25)
    train, test = {p.text for p in a.split("train", 999)}, {p.text for p in a.split("test", 999)}
    assert not train & test and len(train | test) == 40
    assert [p.uid for p in a.split("test", 999)] == [p.uid for p in b.split("test", 999)]
    assert {p.text for p in a.split("test", 999)} == {f"question {i}" for i in range(40)
                                                      if hash_fraction(f"question {i}") < 0.25}


def test_test_file_is_the_held_out_split_and_overlapping_train_rows_are_dropped(tmp_path):
    data = jsonl(tmp_path / "train.jsonl", [{"prompt": f"q{i}", "answer": "1"} for i in range(10)])
    held = jsonl(tmp_path / "test.jsonl", [{"prompt": f"q{i}", "answer": "1"} for i in (3, 11, 12)])
    t = task(data, test_path=str(held))
    assert [p.text for p in t.split("test", 9)] == ["q3", "q11", "q12"]
    assert [p.uid for p in t.split("test", 9)] == ["test.jsonl:1", "test.jsonl:2", "test.jsonl:3"]  # file:line
    assert "q3" not in {p.text for p in t.split("train", 99)} and len(t.split("train", 99)) == 9


def test_config_requires_reward_functions_and_a_chat_template_for_conversations(tmp_path):
    data = write_chat_jsonl(tmp_path / "d.jsonl", 20)
    with pytest.raises(ValueError, match="needs reward.functions"):
        task_from_config(load_config(None, [f"data.path={data}"]))
    # A tokenizer without a chat template: a clear error when rendering a conversation.
    no_template = chat_tokenizer()
    no_template.chat_template = None
    t = task_from_config(load_config(None, [f"data.path={data}", "reward.functions=[exact_answer]"]),
                         tokenizer=no_template)
    with pytest.raises(ValueError, match="no chat_template"):
        t.split("train", 1)
    # The built-in model's character tokenizer has one: a user message ends with the newline it was warmed up on.
    t = task_from_config(load_config(None, [f"data.path={data}", "reward.functions=[exact_answer]"]),
                         tokenizer_loader=build_tokenizer)
    assert t.split("train", 1)[0].text.startswith("What is ") and t.split("train", 1)[0].text.endswith("?\n")


def test_is_correct_is_the_first_reward_at_its_maximum(tmp_path):
    t = task(jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i}", "answer": "12"} for i in range(20)]),
             test_fraction=0.5)
    p = t.split("test", 1)[0]
    assert t.is_correct(p, "it is 12") and not t.is_correct(p, "it is 13")


def test_unknown_files_and_unreachable_hub_names_are_clear_errors(tmp_path, monkeypatch):
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(ValueError, match="unknown file type '.txt'"):
        task(tmp_path / "d.txt")
    with pytest.raises(DataFileError, match="does not exist"):
        task(tmp_path / "missing.jsonl")
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match=r"Hub data set .*no network"):
        task("someone/some-dataset")


def test_the_task_carries_its_rewards_for_a_trainer_built_around_it(tmp_path):
    t = task(jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i}", "answer": "1"} for i in range(20)]),
             reward_functions=["exact_answer", ("len", len, 0.5)])
    assert [(n, w) for n, _, w in t.reward_functions()] == [("exact_answer", 1.0), ("len", 0.5)]
