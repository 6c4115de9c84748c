"""Issue 51, bad input and faults round four (items 2-7), each through the real entry point (`grpo.cli.main`): a disk
that fills at every save path (inside torch's own writer, best/, a merged LoRA final/, metrics, plots, `grpo
report`), rows named by one number (the line an editor shows), non-finite settings and weights that training made
non-finite, chat templates that fail on a row, and counts no run can mean. Each ends in one message naming the
thing, without a traceback (exit 2 for input, 1 for a full disk, 3 for a run that diverged), nothing half-written.

A full disk is real: a tmpfs mounted for the test (root only; tests/test_bad_input_round3.py `small_disk`), filled
with a file at the moment the test names."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch
from test_bad_input import GOOD, SMALL, data_file, run, small
from helpers.tiny_models import save_small_builtin
from test_bad_input_round3 import small_disk

import grpo.train.checkpoint.save as ckpt
from grpo.errors import EXIT_FAILURE, EXIT_HEALTH, EXIT_OK, EXIT_USER
from grpo.train.checkpoint import load_checkpoint

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The tiny built-in architecture of tests/test_bad_input.py (its tokenizer has a chat template)."""
    return save_small_builtin(tmp_path_factory.mktemp("tiny-model"), size=SMALL)


NEEDED = r"\(([0-9.]+ \w+) free of 8.0 MiB; about ([0-9.]+) (B|KiB|MiB) needed\)"


def fill(disk: Path, leave: int = 0) -> None:
    """Fill `disk` with one file until `leave` bytes are free (0: until the disk is full)."""
    free = shutil.disk_usage(disk).free
    with open(disk / "filler", "ab") as f:
        try:
            if leave:
                f.write(b"\0" * max(0, free - leave))
            else:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
        except OSError:
            pass


def kib(value: str, unit: str) -> float:
    return float(value) * {"B": 1 / 1024, "KiB": 1, "MiB": 1024}[unit]


def no_partials(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.name.startswith(".") and p.name != "filler"]


# ---------------------------------------------------------------- item 2: a full disk, every save path


def test_a_disk_that_fills_inside_torch_save_is_named_not_unexpected_pos(model_dir, tmp_path, capsys, monkeypatch):
    saves = []

    def hook(stage):  # the step-1 checkpoint commits; at step 2's the disk fills under the optimizer's torch.save
        if stage == "after_tokenizer":
            saves.append(stage)
            if len(saves) == 2:
                fill(disk, leave=4096)

    with small_disk(tmp_path / "disk") as disk:
        run_dir = disk / "run"
        monkeypatch.setattr(ckpt, "_fault_hook", hook)
        code, err = run(small(model_dir, run_dir, "train.save_every=1"), capsys)
        assert code == EXIT_FAILURE
        assert "unexpected pos" not in err and "enforce fail" not in err, err
        found = re.search(rf"the final checkpoint save at step 2 failed: .*the disk is full \(No space left on "
                          rf"device\) on {disk} {NEEDED} while writing {run_dir / 'checkpoints' / 'step-000002'}", err)
        assert found, err
        weights = (run_dir / "checkpoints" / "step-000001" / "model.safetensors").stat().st_size
        assert kib(found.group(2), found.group(3)) * 1024 > weights  # the weights and their optimizer moments
        assert f"The previous checkpoint is intact: {run_dir / 'checkpoints' / 'step-000001'}" in err
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000001"]
        assert load_checkpoint(run_dir / "checkpoints" / "step-000001").step == 1
        assert not no_partials(run_dir)


def test_torch_s_own_words_for_a_full_disk_are_recognised_both_ways(tmp_path):
    from grpo.tracking.rundir import disk_full
    from grpo.train.checkpoint.files import torch_save

    state = {"m": torch.zeros(100_000)}
    with small_disk(tmp_path / "disk", "1m") as disk:
        fill(disk, leave=8192)
        with pytest.raises(RuntimeError) as raw:  # torch's own file: "unexpected pos", no errno
            torch.save(state, disk / "raw.pt")
        assert "No space left" not in str(raw.value) and not disk_full(raw.value)
        assert disk_full(raw.value, disk / "raw.pt")  # the disk it wrote to is full: that is the cause
        (disk / "raw.pt").unlink(missing_ok=True)
        with pytest.raises(Exception) as through_python:  # a Python file: the OSError is in its context
            torch_save(state, disk / "py.pt")
        assert disk_full(through_python.value)
    assert not disk_full(raw.value, tmp_path)  # the same words on a disk with room: not a full disk


def test_a_full_disk_at_best_names_the_disk_and_keeps_the_last_checkpoint(model_dir, tmp_path, capsys, monkeypatch):
    import grpo.train.loop as loop

    accuracies = iter([0.0, 0.0, 0.25, 0.25, 0.5, 0.5])  # test, validation at step 0, 1, 2: each step a new best
    monkeypatch.setattr(loop, "_evaluate", lambda trainer, progress=None, split="test": next(accuracies))

    def hook(stage):  # the step-1 checkpoint is committed (best/ of step 1 before it), then the disk is full
        if stage == "after_rename":
            fill(disk)

    with small_disk(tmp_path / "disk") as disk:
        run_dir = disk / "run"
        monkeypatch.setattr(ckpt, "_fault_hook", hook)
        code, err = run(small(model_dir, run_dir, "train.save_every=1", "train.eval_every=1", "eval.val_n=4"),
                        capsys)
        assert code == EXIT_FAILURE
        best = run_dir / "checkpoints" / "best"
        assert re.search(rf"the disk is full \(No space left on device\) on {disk} {NEEDED} while writing {best} "
                         r"\(the best model \(step 2\)", err), err
        assert f"the previous {best} is kept" in err
        assert f"The last committed checkpoint is intact: {run_dir / 'checkpoints' / 'step-000001'}; free space, " \
               f"then finish the run with: grpo train {run_dir / 'config.yaml'} --output-dir {run_dir} --resume" in err
        assert json.loads((best / "best.json").read_text())["step"] == 1  # the step-1 best, whole
        assert not no_partials(run_dir)


def test_a_full_disk_at_a_merged_lora_final_says_what_the_merged_weights_need(model_dir, tmp_path, capsys,
                                                                              monkeypatch):
    def hook(stage):  # the step-2 checkpoint (the adapter) is committed, then the disk is full for final/
        if stage == "after_rename":
            fill(disk)

    with small_disk(tmp_path / "disk") as disk:
        run_dir = disk / "run"
        monkeypatch.setattr(ckpt, "_fault_hook", hook)
        code, err = run(small(model_dir, run_dir, "model.lora_rank=4", "model.save_merged=true"), capsys)
        assert code == EXIT_FAILURE
        found = re.search(rf"on {disk} {NEEDED} while writing {run_dir / 'final'} \(the final model \(step 2\)", err)
        assert found, err
        merged = (model_dir / "model.safetensors").stat().st_size  # the merged model: the base model's weights
        assert kib(found.group(2), found.group(3)) * 1024 >= 0.9 * merged
        assert f"The last committed checkpoint is intact: {run_dir / 'checkpoints' / 'step-000002'}" in err
        assert not (run_dir / "final").exists() and not no_partials(run_dir)


def test_a_full_disk_at_the_metrics_names_the_file_and_the_checkpoint(model_dir, tmp_path, capsys, monkeypatch):
    def hook(stage):  # step 2's checkpoint is committed, then the disk is full: the next page metrics.jsonl needs
        if stage == "after_rename":  # (at step 3 or 4: a step's row is about 1.2 KiB) cannot be had
            fill(disk)

    argv = ["train.steps=5", "train.save_every=2"]
    with small_disk(tmp_path / "disk") as disk:
        run_dir = disk / "run"
        monkeypatch.setattr(ckpt, "_fault_hook", hook)
        code, err = run(small(model_dir, run_dir, *argv), capsys)
        assert code == EXIT_FAILURE
        assert re.search(rf"the disk is full \(No space left on device\) on {disk} \(0 B free of 8.0 MiB; about "
                         rf"1\.\d KiB needed\) while writing {run_dir / 'metrics.jsonl'}; the line may be cut short, "
                         "a resume drops it", err), err
        assert f"The last committed checkpoint is intact: {run_dir / 'checkpoints' / 'step-000002'}" in err
        (disk / "filler").unlink()
        monkeypatch.setattr(ckpt, "_fault_hook", lambda stage: None)
        code, err = run([*small(model_dir, run_dir, *argv), "--resume"], capsys)
        assert code == EXIT_OK, err  # the command it names finishes the run
        steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert steps == [0, 1, 2, 3, 4, 5]


def test_a_full_disk_at_the_plots_and_at_grpo_report_is_one_message(model_dir, tmp_path, capsys, monkeypatch):
    import grpo.tracking.plots as plots

    real = plots.plot_run

    def full_then_plot(run_dir):  # final/ and summary.json are written; the disk fills before the plots
        fill(disk)
        return real(run_dir)

    with small_disk(tmp_path / "disk", "16m") as disk:
        run_dir = disk / "run"
        monkeypatch.setattr(plots, "plot_run", full_then_plot)
        code, err = run(small(model_dir, run_dir, "log.plots=true"), capsys)
        assert code == EXIT_FAILURE
        found = re.search(rf"the disk is full \(No space left on device\) on {disk} \([0-9.]+ \w+ free of 16.0 MiB; "
                          rf"about ([0-9.]+) (KiB|MiB) needed\) while writing {run_dir / 'plots'}/\w+\.png; nothing "
                          r"was written there", err)
        assert found and kib(*found.groups()) > 4, err  # a PNG's bytes, drawn in memory first
        assert f"The last committed checkpoint is intact: {run_dir / 'checkpoints' / 'step-000002'}" in err
        assert (run_dir / "final" / "model.safetensors").is_file() and (run_dir / "summary.json").is_file()
        assert not no_partials(run_dir) and all(p.stat().st_size > 0 for p in (run_dir / "plots").iterdir())
        monkeypatch.setattr(plots, "plot_run", real)
        code, err = run(["report", str(run_dir)], capsys)  # the disk is still full: its plots cannot be redrawn
        assert code == EXIT_FAILURE and re.search(r"the disk is full \(No space left on device\) on .* needed\) "
                                                  rf"while writing {run_dir / 'plots'}/\w+\.png; nothing was", err), err
        (disk / "filler").unlink()
        assert run(["report", str(run_dir)], capsys)[0] == EXIT_OK  # space freed: the command it names works
        (run_dir / "report.html").unlink()
        largest = max(p.stat().st_size for p in (run_dir / "plots").iterdir())
        fill(disk, leave=largest + 65536)  # room to redraw each plot, not for the page that embeds two of them
        code, err = run(["report", str(run_dir)], capsys)
        found = re.search(rf"on {disk} \([0-9.]+ KiB free of 16.0 MiB; about ([0-9.]+) KiB needed\) while writing "
                          rf"{run_dir / 'report.html'}; nothing was written there", err)
        assert code == EXIT_FAILURE and found and float(found.group(1)) * 1024 > largest, err
        assert not (run_dir / "report.html").exists() and not no_partials(run_dir)
        (disk / "filler").unlink()
        code, err = run(["report", str(run_dir)], capsys)
        assert code == EXIT_OK and (run_dir / "report.html").stat().st_size > 1000, err


# ---------------------------------------------------------------- items 3 and 6: one number for a row


def chat_model(model_dir: Path, tmp_path: Path, template: str | None) -> Path:
    """A copy of the tiny model whose chat template is `template` (None: no template)."""
    path = Path(shutil.copytree(model_dir, tmp_path / "chat-model"))
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "chat_template.jinja").unlink(missing_ok=True)
    if template is not None:
        (path / "chat_template.jinja").write_text(template)
    return path


def chat_rows(n: int = 20, system_at: int | None = None) -> bytes:
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "answer": str(i + 1)} for i in range(n)]
    if system_at is not None:
        rows[system_at]["prompt"].insert(0, {"role": "system", "content": "Be brief."})
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_a_row_too_long_is_named_by_its_file_line_only(model_dir, tmp_path, capsys):
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(20)]
    rows[14]["prompt"] = "What is " + " + ".join(["1"] * 60) + "?"  # 14 rows before it: line 15
    path = data_file(tmp_path, "long.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    code, err = run(small(model_dir, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]",
                          "data.test_fraction=0.01", "data.max_prompt_tokens=100"), capsys)
    assert code == EXIT_USER
    assert re.search(r"grpo: long\.jsonl line 15: column 'prompt' has \d+ tokens, outside 1\.\.data\.max_prompt_tokens"
                     r"=100", err), err
    assert "row 14" not in err and "uid" not in err and "long.jsonl:14" not in err, err


def test_rows_dropped_by_the_filter_are_named_by_their_lines(model_dir, tmp_path, capsys, caplog):
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(20)]
    rows[6]["prompt"] = "What is " + " + ".join(["1"] * 60) + "?"
    path = data_file(tmp_path, "long.jsonl", b"\n" + "".join(json.dumps(r) + "\n" for r in rows).encode())
    with caplog.at_level(logging.WARNING, logger="grpo.data"):
        code, err = run(small(model_dir, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]",
                              "data.test_fraction=0.01", "data.max_prompt_tokens=100",
                              "data.filter_long_prompts=true", "train.steps=1"), capsys)
    assert code == EXIT_OK, err
    assert "dropped 1 of 19 train prompts" in caplog.text and "long.jsonl line 8 (" in caplog.text, caplog.text


def test_a_conversation_for_a_model_without_a_template_names_the_editor_line(model_dir, tmp_path, capsys):
    plain = chat_model(model_dir, tmp_path, None)
    path = data_file(tmp_path, "train_chat.jsonl", chat_rows())
    code, err = run(small(plain, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]"), capsys)
    assert code == EXIT_USER
    assert "grpo: train_chat.jsonl line 1: the prompt is a conversation (a list of messages) but the tokenizer of " \
           "model.name has no chat_template" in err, err
    assert "train_chat.jsonl:0" not in err


def test_file_rows_have_the_file_line_as_their_uid_and_json_arrays_too(tmp_path):
    from grpo.data.files import FileTask

    rows = [{"prompt": f"q{i}", "answer": "1"} for i in range(6)]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n" + "".join(json.dumps(r) + "\n" for r in rows))  # a blank first line: row k on line k + 2
    array = tmp_path / "d.json"
    array.write_text(json.dumps(rows, indent=1))  # "[", then each object over 4 lines from line 2
    for path, first, step in ((jsonl, 2, 1), (array, 2, 4)):
        task = FileTask(str(path), reward_functions=["exact_answer"], test_fraction=0.5)
        got = {p.uid: p.where for p in task.split("train", 99) + task.split("test", 99)}
        want = {f"{path.name}:{first + k * step}": f"{path.name} line {first + k * step}" for k in range(6)}
        assert got == want
    mixed = tmp_path / "mixed.json"
    mixed.write_text('[{"prompt": "q", "answer": "1"},\n\n 7]')
    with pytest.raises(ValueError, match=r"mixed\.json line 3: a number in the array"):
        FileTask(str(mixed), reward_functions=["exact_answer"])


# ---------------------------------------------------------------- item 4: non-finite settings and weights


@pytest.mark.parametrize(("override", "field", "value"), [
    ("optim.lr=inf", "optim.lr", "'inf'"), ("optim.lr=.nan", "optim.lr", "nan"),
    ("optim.lr=1e400", "optim.lr", "'1e400'"),
    ("optim.betas=[0.9, .inf]", "optim.betas[1]", "inf"), ("reward.max_abs=-.inf", "reward.max_abs", "-inf"),
    ("algo.clip_high=nan", "algo.clip_high", "'nan'"), ("rollout.temperature=inf", "rollout.temperature", "'inf'"),
])
def test_non_finite_settings_are_refused_naming_the_field(override, field, value, model_dir, tmp_path, capsys):
    code, err = run(small(model_dir, tmp_path / "run", override), capsys)
    assert code == EXIT_USER
    assert f"{field}: must be a finite number, got {value}: no setting takes inf or NaN" in err, err
    assert len(err.strip().splitlines()) == 2 and not (tmp_path / "run").exists()


def test_every_float_setting_refuses_inf_and_nan():
    from grpo.config import ConfigError, load_config
    from grpo.config.load import describe_keys

    floats = {key: kind for key, kind, *_ in describe_keys() if re.search(r"\bfloat\b", kind)}
    assert "optim.lr" in floats and "rollout.vllm_probe_tolerance" in floats and len(floats) > 20
    for key, kind in floats.items():
        for bad in (".inf", "-.inf", ".nan"):
            value = f"[{bad}, {bad}]" if kind.startswith(("list", "tuple")) else bad
            with pytest.raises(ConfigError, match=re.escape(key) + r"(\[\d\])?: must be a finite number"):
                load_config(None, [f"{key}={value}"])


def test_weights_a_huge_learning_rate_makes_nan_are_blamed_on_training_not_the_disk(model_dir, tmp_path, capsys):
    for extra, found in ((["train.save_every=1"], ""), ([], r" \(NaN in its next-token logits\)")):
        run_dir = tmp_path / f"run{len(extra)}"
        code, err = run(small(model_dir, run_dir, "optim.lr=3e38", "optim.warmup_steps=0", "train.steps=3", *extra),
                        capsys)  # the first update: every weight NaN (a save finds it, or the next generation)
        assert code == EXIT_HEALTH, err
        assert re.search(r"grpo: WeightsDiverged: the policy's weights became non-finite in training: after the "
                         r"update of step 1, \d+ of its \d+ weight tensors hold NaN/inf \(the first: [\w.]+\)"
                         + found + rf"\. The model on disk \({model_dir}\) is untouched", err), err
        assert "optim.lr=3e+38, too large for this model" in err and "its weights are damaged" not in err
        assert "No checkpoint was committed before it" in err
        assert not (run_dir / "checkpoints").exists() or not list((run_dir / "checkpoints").iterdir())


def test_weights_that_go_nan_at_step_2_name_the_intact_step_1_checkpoint(model_dir, tmp_path, capsys, monkeypatch):
    from grpo.train.trainer import Trainer

    real = Trainer.step

    def step_then_blow_up(self):  # what a learning-rate spike at step 2 does to the weights in memory
        result = real(self)
        if self.step_count == 2:
            with torch.no_grad():
                next(self.policy.parameters()).fill_(float("inf"))
        return result

    monkeypatch.setattr(Trainer, "step", step_then_blow_up)
    run_dir = tmp_path / "run"
    code, err = run(small(model_dir, run_dir, "train.steps=4", "train.save_every=1", "algo.scale=none"), capsys)
    assert code == EXIT_HEALTH, err
    assert "after the update of step 2, 1 of its" in err and "hold" in err, err
    assert "the rewards' scale: algo.scale=none passes rewards up to reward.max_abs=1e+06" in err
    step1 = run_dir / "checkpoints" / "step-000001"
    lr = json.loads((step1 / "trainer_state.json").read_text())["config"]["optim"]["lr"]
    assert f"The last committed checkpoint, {step1}, is intact (a checkpoint is never committed with non-finite " \
           f"weights): resume from it with a lower learning rate: grpo train {run_dir / 'config.yaml'} " \
           f"optim.lr={lr / 10:g} --output-dir {run_dir} --resume" in err
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000001"]  # step 2 never committed
    from safetensors.torch import load_file

    assert all(torch.isfinite(t).all() for t in load_file(step1 / "model.safetensors").values())


def test_a_model_loaded_with_nan_weights_is_still_named_as_damaged(model_dir, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    bad = Path(shutil.copytree(model_dir, tmp_path / "nan-model"))
    weights = load_file(bad / "model.safetensors")
    weights["model.norm.weight"] = torch.full_like(weights["model.norm.weight"], float("nan"))
    save_file(weights, bad / "model.safetensors", metadata={"format": "pt"})
    code, err = run(small(bad, tmp_path / "run"), capsys)
    assert code == EXIT_USER and "its weights are damaged" in err and "WeightsDiverged" not in err, err


# ---------------------------------------------------------------- item 5: a chat template that fails on a row

RAISES = "{{ raise_exception('this model needs a system message first') }}"
ROLES = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
         "{% endif %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>"
         "{% endif %}")


@pytest.mark.parametrize(("template", "line", "words"), [
    (RAISES, 1, "this model needs a system message first [TemplateError]; fix the row's messages"),
    (ROLES, 8, "System role not supported [TemplateError]; fix the row's messages (their roles and order)"),
    ("{% for m in messages %}{{ m['role'] }", 1, "unexpected '}' (line 1 of the template) [TemplateSyntaxError]; the "
                                                 "template does not parse: fix it"),
])
def test_a_chat_template_that_fails_on_a_row_is_one_line(template, line, words, model_dir, tmp_path, capsys):
    model = chat_model(model_dir, tmp_path, template)
    path = data_file(tmp_path, "train_chat.jsonl", chat_rows(system_at=7))  # a system message on line 8
    code, err = run(small(model, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]"), capsys)
    assert code == EXIT_USER, err
    assert f"grpo: the chat template of the model {model} ({model / 'chat_template.jinja'}) fails on " \
           f"train_chat.jsonl line {line}: {words}" in err, err  # the first train row it fails on
    assert len(err.strip().splitlines()) == 1 and "jinja2" not in err
    assert not (tmp_path / "run").exists()
    if template != ROLES:  # grpo eval renders the held-out rows: the first of them
        code, err = run(["eval", str(model), "reward.functions=[exact_answer]", "--data", str(path), "--n", "2"],
                        capsys)
        assert code == EXIT_USER and re.search(r"fails on train_chat\.jsonl line \d+: " + re.escape(words), err), err


def test_a_failing_template_in_tokenizer_config_names_that_file(model_dir, tmp_path, capsys):
    model = chat_model(model_dir, tmp_path, None)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": RAISES}))
    path = data_file(tmp_path, "train_chat.jsonl", chat_rows())
    code, err = run(small(model, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]"), capsys)
    assert code == EXIT_USER
    assert f"({model / 'tokenizer_config.json'}, its 'chat_template') fails on train_chat.jsonl line 1: " in err, err


def test_debug_shows_the_template_traceback(model_dir, tmp_path, capsys):
    model = chat_model(model_dir, tmp_path, RAISES)
    path = data_file(tmp_path, "train_chat.jsonl", chat_rows())
    from grpo.cli import main

    code = main([*small(model, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]"), "--debug"])
    err = capsys.readouterr().err
    assert code == EXIT_USER and "Traceback" in err and "raise_exception" in err


# ---------------------------------------------------------------- item 7: counts no run can mean


@pytest.mark.parametrize(("override", "words"), [
    ("train.steps=10000000000000000000000", "train.steps: must be at most 100,000,000 (10^8 steps take 3 years at "
                                            "one step a second), got 10000000000000000000000"),
    ("optim.warmup_steps=1000000000", "optim.warmup_steps: must be at most 100,000,000"),
    ("algo.epochs=100000", "algo.epochs: must be at most 1,000 (updates of one batch: the step would not end)"),
    ("rollout.worker_threads=1000000", "rollout.worker_threads: must be at most 4,096"),
    ("train.seed=18446744073709551616", "train.seed: must be at most 4,294,967,295 (a seed is a 32-bit number)"),
    ("train.seed=-18446744073709551616", "train.seed: must be at least -4,294,967,295"),
    ("eval.n=10000000000", "eval.n: must be at most 1,000,000,000 (no run means a count past 10^9)"),
    ("rollout.group_size=10000000000", "rollout.group_size: must be at most 1,000,000,000"),
])
def test_counts_no_run_can_mean_are_refused_naming_the_bound(override, words, model_dir, tmp_path, capsys):
    code, err = run(small(model_dir, tmp_path / "run", override), capsys)
    assert code == EXIT_USER and words in err, err
    assert not (tmp_path / "run").exists()


def test_every_int_setting_has_a_bound_listed_by_list_keys(capsys):
    from grpo.cli import main
    from grpo.config import ConfigError, load_config
    from grpo.config.load import describe_keys
    from grpo.config.limits import count_limit

    ints = [(key, text) for key, kind, _, text in describe_keys() if kind.split(" ")[0] == "int"]
    assert len(ints) > 30
    for key, text in ints:
        limit = count_limit(key)
        assert f"at most {limit:,}" in text, (key, text)
        load_config(None, [f"{key}={limit}"])  # the bound itself is taken
        with pytest.raises(ConfigError, match=re.escape(key) + ": must be at most"):
            load_config(None, [f"{key}={limit + 1}"])
    assert main(["train", "--list-keys"]) == 0
    assert "at most 100,000,000" in capsys.readouterr().out


def test_more_steps_than_the_data_can_hold_is_warned_about(model_dir, tmp_path, capsys, caplog, monkeypatch):
    import grpo.train.trainer as trainer_module

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):  # the warning comes before the model loads; stop there
        raise Stop()

    monkeypatch.setattr(trainer_module, "load_policy", stop)
    path = data_file(tmp_path, "small.jsonl", GOOD)  # 20 rows, 18 for training
    with caplog.at_level(logging.WARNING, logger="grpo.data"), pytest.raises(Stop):
        from grpo.cli import main

        main(small(model_dir, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]",
                   "train.steps=100000000"))
    assert re.search(r"train\.steps=100000000 x rollout\.prompts_per_step=2 draws each of the \d+ train prompts about "
                     r"[0-9.]+e\+07 times, more than 1000 passes over the data: lower train\.steps or give more data",
                     caplog.text), caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="grpo.data"), pytest.raises(Stop):
        main(small(model_dir, tmp_path / "run2", f"data.path={path}", "reward.functions=[exact_answer]",
                   "train.steps=5000"))  # 5000 x 2 / 17: about 590 passes
    assert "passes over the data" not in caplog.text

