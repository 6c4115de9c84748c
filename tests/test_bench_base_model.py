"""grpo.bench.base_model's task: every distinct problem once, answers right, held-out problems never trained on."""

from __future__ import annotations

import json

from grpo.bench.base_model import HELD_OUT, problems, write_task


def test_every_distinct_problem_once_with_its_answer():
    rows = problems(seed=0)
    # 100 x 100 sums and the 5,050 differences a - b with b <= a, counted by hand
    assert len(rows) == 100 * 100 + 100 * 101 // 2
    assert len({r["prompt"] for r in rows}) == len(rows)
    for r in rows[:500]:
        a, op, b = r["prompt"].removeprefix("Question: What is ").removesuffix("?\nAnswer:").split()
        assert int(r["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b)) >= 0
    assert [r["prompt"] for r in problems(seed=1)] != [r["prompt"] for r in rows]  # the seed shuffles


def test_the_held_out_file_and_the_training_file_are_disjoint(tmp_path):
    train, test = write_task(tmp_path, seed=3, train_size=1000)
    train_rows = [json.loads(line) for line in train.read_text().splitlines()]
    test_rows = [json.loads(line) for line in test.read_text().splitlines()]
    assert len(test_rows) == HELD_OUT and len(train_rows) == 1000
    assert not {r["prompt"] for r in train_rows} & {r["prompt"] for r in test_rows}
