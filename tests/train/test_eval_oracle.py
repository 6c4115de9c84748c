"""Evaluation against an oracle: `evaluate_model` and `grpo eval` on a scripted model whose greedy answer to every
prompt is known give exactly 1.0 (all right), 0.0 (all wrong) and k/n (the first k right), for the arithmetic task,
a data set file task and the code task, whose programs must really run in the sandbox (a spy counts them), in
evaluation and in a training step's rewards.

ScriptedLM is a stand-in causal LM that the real Sampler drives (prefill, cache, decode steps, compaction): its
logits put the next token of a scripted completion on top, so greedy decoding writes exactly that completion.
"""

from __future__ import annotations

import json
import sys
from fractions import Fraction
from types import SimpleNamespace

import pytest
import torch
from wiring_helpers import one_thread  # noqa: F401  (an autouse fixture)
from train_helpers import SMALL
from wiring_helpers import FixedSampler

from grpo.cli import main
from grpo.config import load_config
from grpo.data import get_task, task_from_config
from grpo.models.builtin import build_model, build_tokenizer
from grpo.train.evaluate import evaluate_model


class _ScriptCache:
    """Per-row state of ScriptedLM: the scripted tokens of each row and the decode step."""

    def __init__(self, rows: list[list[int]]):
        self.rows, self.step = rows, 0

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.rows = [r for r in self.rows for _ in range(repeats)]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.rows = [self.rows[i] for i in indices.tolist()]


class ScriptedLM(torch.nn.Module):
    """Greedy decoding writes script[prompt text] (then EOS) for every prompt it knows; an unknown prompt is an
    error, so the oracle cannot be fooled by a prompt it was not told about."""

    def __init__(self, tokenizer, script: dict[str, str]):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # a device and a parameter, like any model
        self.tok, self.vocab = tokenizer, len(tokenizer)
        self.script = {p: tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                       for p, c in script.items()}
        self.config = SimpleNamespace(model_type="scripted")

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True,
                logits_to_keep=0, **kwargs):
        if past_key_values is None:  # prefill: read the prompts
            masks = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
            cache = _ScriptCache([self.script[self.tok.decode(ids[m.bool()].tolist())]
                                  for ids, m in zip(input_ids, masks)])
        else:
            cache = past_key_values
            cache.step += 1
        logits = torch.full((len(cache.rows), 1, self.vocab), -10.0)
        for b, target in enumerate(cache.rows):
            logits[b, 0, target[min(cache.step, len(target) - 1)]] = 10.0
        return SimpleNamespace(logits=logits, past_key_values=cache)


def arithmetic_answers(prompts, right: set[int]) -> dict[str, str]:
    return {p.text: f"so it is {p.answer}" if i in right else f"so it is {int(p.answer) + 1}"
            for i, p in enumerate(prompts)}


def code_answers(prompts, right: set[int]) -> dict[str, str]:
    """Right: the hidden linear function. Wrong: the two shown values hard-coded (the hidden tests fail)."""
    out = {}
    for i, p in enumerate(prompts):
        a, b, x0 = p.meta["a"], p.meta["b"], p.meta["x0"]
        body = f"{a} * x + {b}" if i in right else f"{a * x0 + b} if x == {x0} else {a * (x0 + 1) + b}"
        out[p.text] = f"```python\ndef f(x):\n    return {body}\n```"
    return out


CASES = [("all right", 5, set(range(5))), ("all wrong", 5, set()), ("2 of 5", 5, {1, 3})]


@pytest.fixture
def sandbox_spy(monkeypatch):
    """Counts the programs run in the sandbox: wraps grpo.sandbox.run_python wherever it was imported."""
    import grpo.sandbox as sandbox

    real, calls = sandbox.run_python, []

    def spy(code, *args, **kwargs):
        res = real(code, *args, **kwargs)
        calls.append((code, res.status))
        return res

    for name, module in list(sys.modules.items()):
        if name.startswith("grpo") and getattr(module, "run_python", None) is real:
            monkeypatch.setattr(module, "run_python", spy)
    return calls


def expected(n: int, right: set[int]) -> float:
    return float(Fraction(len(right), n))


@pytest.mark.parametrize("case, n, right", CASES, ids=[c[0] for c in CASES])
def test_arithmetic_accuracy_is_the_oracles(case, n, right):
    tok, task = build_tokenizer(), get_task("arithmetic")
    prompts = task.split("test", n)
    res = evaluate_model(ScriptedLM(tok, arithmetic_answers(prompts, right)), tok, task, prompts, batch_size=2,
                         max_new_tokens=16)
    assert res["accuracy"] == expected(n, right)
    assert res["correct"] == [i in right for i in range(n)]
    assert res["completions"] == list(arithmetic_answers(prompts, right).values())


def write_data_file(tmp_path):
    """3 training rows and 5 held-out rows ('How much is a plus b?', answer a + b); returns the overrides."""
    pairs = zip(range(3, 11), range(9, 1, -1))
    rows = [{"prompt": f"How much is {a} plus {b}?", "answer": str(a + b)} for a, b in pairs]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[3:]))
    return [f"data.path={tmp_path / 'train.jsonl'}", f"data.test_path={tmp_path / 'test.jsonl'}",
            "reward.functions=[exact_answer]"]


@pytest.mark.parametrize("case, n, right", CASES, ids=[c[0] for c in CASES])
def test_data_file_accuracy_is_the_oracles(case, n, right, tmp_path):
    tok = build_tokenizer()
    task = task_from_config(load_config(None, write_data_file(tmp_path)), tokenizer=tok)
    prompts = task.split("test", n)
    assert len(prompts) == n
    res = evaluate_model(ScriptedLM(tok, arithmetic_answers(prompts, right)), tok, task, prompts, max_new_tokens=16)
    assert res["accuracy"] == expected(n, right) and res["correct"] == [i in right for i in range(n)]


@pytest.mark.parametrize("case, n, right", [("all right", 3, {0, 1, 2}), ("all wrong", 3, set()),
                                            ("2 of 5", 5, {0, 4})], ids=["all right", "all wrong", "2 of 5"])
def test_code_accuracy_is_the_oracles_and_the_programs_run_in_the_sandbox(case, n, right, sandbox_spy, no_leak):
    tok, task = build_tokenizer(), get_task("code")
    prompts = task.split("test", n)
    script = code_answers(prompts, right)
    res = evaluate_model(ScriptedLM(tok, script), tok, task, prompts, max_new_tokens=64)
    assert res["completions"] == list(script.values())
    assert res["accuracy"] == expected(n, right) and res["correct"] == [i in right for i in range(n)]
    assert len(sandbox_spy) == n, "every program runs in the sandbox, once"
    ran = [code for code, _ in sandbox_spy]
    for i, p in enumerate(prompts):  # each completion's program is among those run
        body = script[p.text].split("return ")[1].split("\n")[0]
        assert any(body in code for code in ran), p.uid
    assert all(status == "passed" for _, status in sandbox_spy)  # the harness ran; the verdict is in its output


@pytest.fixture
def cli_model(tmp_path, monkeypatch):
    """A function: script -> a model directory for `grpo eval` whose loaded model is ScriptedLM(script)."""
    import transformers

    tok = build_tokenizer()
    model_dir = tmp_path / "run" / "final"
    # A real (tiny) saved model, so `grpo eval`'s model-directory checks pass; loading it returns the oracle.
    build_model(tok, size=SMALL).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    holder = {}
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda path, *a, **k: ScriptedLM(tok, holder["script"]))

    def make(script: dict[str, str], config=None):
        holder["script"] = script
        if config is not None:
            (model_dir.parent / "config.yaml").write_text(config.to_yaml())
        return model_dir

    return make


def cli_eval(args, capsys) -> dict:
    capsys.readouterr()
    assert main(["eval", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_grpo_eval_reports_the_oracles_accuracy_for_each_task(cli_model, tmp_path, capsys, sandbox_spy):
    n, right = 5, {0, 2, 3}
    prompts = get_task("arithmetic").split("test", n)
    out = cli_eval([cli_model(arithmetic_answers(prompts, right)), "--n", n], capsys)
    assert (out["accuracy"], out["n"], out["task"]) == (expected(n, right), n, "arithmetic")

    cfg = load_config(None, [*write_data_file(tmp_path), "eval.val_n=0"])  # a short file: every held-out row is test
    prompts = task_from_config(cfg, tokenizer=build_tokenizer()).split("test", n)
    out = cli_eval([cli_model(arithmetic_answers(prompts, right), cfg), "--n", n], capsys)
    assert (out["accuracy"], out["n"], out["task"]) == (expected(n, right), n, "file")

    n, right = 4, {1}
    prompts = get_task("code").split("test", n)
    out = cli_eval([cli_model(code_answers(prompts, right), load_config("code")), "--task", "code", "--n", n], capsys)
    assert (out["accuracy"], out["n"], out["task"]) == (expected(n, right), n, "code")
    assert len(sandbox_spy) == n


def test_code_task_training_rewards_run_the_programs_in_the_sandbox(make_trainer, sandbox_spy, no_leak):
    """A training step of the code task scores each fenced program by running it in the sandbox: per group a right
    program (tests 1, format 1), a hard-coded one (tests 0, format 1), the right one again, and prose without code
    (nothing to run, 0). So reward/tests = 0.5, reward/format = 0.75, and 3 programs run per prompt."""
    class CodeSampler(FixedSampler):
        def generate(self, prompts, n, **kwargs):
            right, wrong = code_answers(prompts, set(range(len(prompts)))), code_answers(prompts, set())
            self.batches.append([[(right[p.text], True), (wrong[p.text], True), (right[p.text], True),
                                  ("f is linear", True)] for p in prompts])
            return super().generate(prompts, n, **kwargs)

    trainer = make_trainer("data.task=code", "rollout.max_new_tokens=64", "rollout.group_size=4",
                           reward_functions=None)
    trainer.sampler = CodeSampler(trainer.tokenizer, [], max_new_tokens=64)
    metrics = trainer.step().metrics
    assert metrics["reward/tests"] == 0.5 and metrics["reward/format"] == 0.75
    assert metrics["reward/mean"] == pytest.approx((1.1 + 0.1 + 1.1 + 0.0) / 4)
    assert len(sandbox_spy) == 3 * 2
