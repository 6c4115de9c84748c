"""A plain question from a data file reaches a model the way it reads a question at inference: data.plain_prompts=auto
puts it through the tokenizer's chat template as one user turn whenever there is a template (the built-in model's:
one newline after a user message; an instruct model's ChatML or Llama-3 turn), and leaves it as it is for a model
without one; raw keeps the text, template insists (issue #27)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.tiny_hf import chat_tokenizer

from grpo.config import load_config
from grpo.data import get_task
from grpo.data import task_from_config
from grpo.data.files import PLAIN_PROMPTS_KEY, DataFileError, FileTask, plain_prompts_use_template
from grpo.models import builtin


def write(path: Path, questions: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"prompt": q, "answer": a}) + "\n" for q, a in questions))
    return path


def test_the_built_in_template_writes_a_user_message_as_the_warm_up_prompts():
    tok = builtin.build_tokenizer()
    arithmetic = get_task("arithmetic").split("train", 3)  # the prompts the model was warmed up on
    for p in arithmetic:
        question = p.text.rstrip("\n")  # "What is 47 + 38?" as a user would type it
        for typed in (question, question + "\n", f"  {question}  "):
            rendered = tok.apply_chat_template([{"role": "user", "content": typed}], tokenize=False,
                                               add_generation_prompt=True)
            assert rendered == p.text
    two = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1 + 1?"}]
    assert tok.apply_chat_template(two, tokenize=False, add_generation_prompt=True) == "Be brief.\nWhat is 1 + 1?\n"
    assert PLAIN_PROMPTS_KEY == builtin.PLAIN_PROMPTS_KEY and plain_prompts_use_template(tok)


def test_the_flag_survives_save_and_load(tmp_path):
    from transformers import AutoTokenizer

    builtin.build_tokenizer().save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert plain_prompts_use_template(loaded) and loaded.chat_template == builtin.CHAT_TEMPLATE
    loaded.save_pretrained(tmp_path / "again")  # a run's final/ directory: saved from the loaded tokenizer
    assert plain_prompts_use_template(AutoTokenizer.from_pretrained(tmp_path / "again"))


def test_a_data_file_of_plain_questions_reads_as_written_with_the_built_in_model(tmp_path):
    rows = [(f"What is {a} + {b}?", str(a + b)) for a in range(10, 20) for b in range(3)]
    path = write(tmp_path / "qa.jsonl", rows)
    cfg = load_config(None, [f"data.path={path}", "reward.functions=[exact_answer]", "data.test_fraction=0.2"])
    task = task_from_config(cfg, tokenizer=builtin.build_tokenizer())  # the built-in model's tokenizer, auto
    prompts = task.split("train", 100) + task.split("test", 100)
    assert len(prompts) == len(rows)
    assert all(p.text.endswith("?\n") and p.text.count("\n") == 1 for p in prompts)
    raw = task_from_config(load_config(None, [f"data.path={path}", "reward.functions=[exact_answer]",
                                              "data.test_fraction=0.2", "data.plain_prompts=raw"]),
                           tokenizer=builtin.build_tokenizer())
    assert {p.text for p in raw.split("train", 100)} == {p.text.rstrip("\n") for p in task.split("train", 100)}


LLAMA3 = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
          "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant"
          "<|end_header_id|>\n\n{% endif %}")


def test_an_instruct_model_gets_plain_questions_as_a_user_turn(tmp_path):
    path = write(tmp_path / "qa.jsonl", [(f"What is {a} + 1?", str(a + 1)) for a in range(20)])
    kw = dict(reward_functions=["exact_answer"], tokenizer=chat_tokenizer(), test_fraction=0.2)
    raw = FileTask(str(path), plain_prompts="raw", **kw).split("train", 1)[0]
    assert raw.text.startswith("What is ") and "<|im_start|>" not in raw.text  # as it is: a base model's input
    task = FileTask(str(path), **kw)
    auto = task.split("train", 1)[0]
    assert auto.text == f"<|im_start|>user\n{raw.text}<|im_end|>\n<|im_start|>assistant\n"  # ChatML turn
    assert task.auto_templated and auto.templated
    forced = FileTask(str(path), plain_prompts="template", **kw).split("train", 1)[0]
    assert forced.text == auto.text
    llama = chat_tokenizer()
    llama.chat_template = LLAMA3
    auto = FileTask(str(path), **(kw | {"tokenizer": llama})).split("train", 1)[0]
    assert auto.text == (f"{llama.bos_token or ''}<|start_header_id|>user<|end_header_id|>\n\n{raw.text}<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\n")
    plain = chat_tokenizer()
    plain.chat_template = None  # a base model: no template, the text as it is
    task = FileTask(str(path), **(kw | {"tokenizer": plain}))
    assert task.split("train", 1)[0].text == raw.text and not task.auto_templated
    plain_tok = chat_tokenizer()
    plain_tok.chat_template = None
    with pytest.raises(DataFileError, match="data.plain_prompts=template but the tokenizer of model.name has no "
                                            "chat_template"):
        FileTask(str(path), plain_prompts="template", **(kw | {"tokenizer": plain_tok})).split("train", 1)
