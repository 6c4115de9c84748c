"""A run directory has an owner (issue #29): a new run never writes over anything, --resume never starts over in
place, --overwrite moves the old contents aside, and results paths are checked before the work. Every case goes
through grpo.cli.main: exit code 2, one message, no traceback, and the directory hashed before and after."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from helpers.tiny_models import save_small_builtin

from grpo.cli import main
from grpo.errors import EXIT_OK, EXIT_USER

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_small_builtin(tmp_path_factory.mktemp("tiny-model"))


def train(model_dir: Path, run_dir: Path | str, *flags: str) -> list[str]:
    return ["train", f"model.name={model_dir}", "train.steps=1", "train.eval_every=0", "eval.n=2", "eval.val_n=0",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4", "data.train_size=20",
            "log.plots=false", "train.preflight=off", "--quiet", "--output-dir", str(run_dir), *flags]


def run(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


def tree_hash(root: Path) -> str:
    """The names and bytes of every file under `root` (nothing may change)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def finished_run(model_dir, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "done"
    assert main(train(model_dir, run_dir)) == EXIT_OK
    assert (run_dir / "final").is_dir() and (run_dir / "checkpoints" / "step-000001" / "COMMITTED").is_file()
    return run_dir


def test_resume_with_nothing_to_resume_is_an_error_never_a_new_run(model_dir, tmp_path, capsys):
    code, err = run(["train", "train.steps=1", "--resume"], capsys)  # no --output-dir
    assert code == EXIT_USER and "--resume continues the run in --output-dir" in err
    missing = tmp_path / "missing"
    code, err = run(train(model_dir, missing, "--resume"), capsys)
    assert code == EXIT_USER and "no intact committed checkpoint" in err and not missing.exists()
    (tmp_path / "empty").mkdir()
    code, err = run(train(model_dir, tmp_path / "empty", "--resume"), capsys)
    assert code == EXIT_USER and "holds nothing" not in err and "(nothing)" in err
    assert list((tmp_path / "empty").iterdir()) == []


def test_resume_from_a_damaged_checkpoint_changes_nothing(finished_run, model_dir, tmp_path, capsys):
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(finished_run, damaged)
    weights = damaged / "checkpoints" / "step-000001" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # cut short
    before = tree_hash(damaged)
    code, err = run(train(model_dir, damaged, "--resume"), capsys)
    assert code == EXIT_USER and "no intact committed checkpoint" in err and "step-000001" in err
    assert tree_hash(damaged) == before  # final/, summary.json and metrics.jsonl untouched


@pytest.mark.parametrize("kind", ["finished", "user files", "a checkpoint"])
def test_a_new_run_refuses_a_directory_that_holds_anything(kind, finished_run, model_dir, tmp_path, capsys):
    import shutil

    target = tmp_path / "target"
    if kind == "finished":
        shutil.copytree(finished_run, target)
        shutil.rmtree(target / "checkpoints")  # final/ but no checkpoints: still someone's run
    elif kind == "user files":
        target.mkdir()
        (target / "config.yaml").write_text("my own notes\n")
        (target / "metrics.jsonl").write_text('{"mine": 1}\n')
    else:
        shutil.copytree(finished_run, tmp_path / "run")
        target = tmp_path / "run" / "checkpoints" / "step-000001"  # training inside a checkpoint
    before = tree_hash(target)
    code, err = run(train(model_dir, target), capsys)
    assert code == EXIT_USER and "is not empty" in err and "--overwrite" in err and "--output-dir" in err
    assert tree_hash(target) == before


def test_overwrite_moves_the_old_contents_aside_and_trains(finished_run, model_dir, tmp_path, capsys):
    import shutil

    target = tmp_path / "again"
    shutil.copytree(finished_run, target)
    before = tree_hash(target)
    code, _ = run(train(model_dir, target, "--overwrite"), capsys)
    assert code == EXIT_OK and (target / "summary.json").is_file()
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("again.old-")]
    assert tree_hash(aside) == before  # nothing deleted: the earlier run, byte for byte
    code, err = run(train(model_dir, target, "--overwrite", "--resume"), capsys)
    assert code == EXIT_USER and "pass one of them" in err


def test_an_empty_output_dir_is_refused(model_dir, capsys):
    code, err = run(train(model_dir, ""), capsys)
    assert code == EXIT_USER and "train.output_dir (--output-dir) is empty" in err


def test_results_paths_are_checked_before_the_work(finished_run, tmp_path, capsys):
    final = str(finished_run / "final")
    for output, words in [(tmp_path / "no" / "such" / "r.jsonl", "does not exist; create it first"),
                          (tmp_path, "is a directory")]:
        code, err = run(["eval", final, "--output", str(output)], capsys)
        assert code == EXIT_USER and words in err
    for n in ("0", "-5"):
        code, err = run(["eval", final, "--n", n], capsys)
        assert code == EXIT_USER and "--n must be at least 1" in err
    code, err = run(["bench", "--quick", "--output", str(tmp_path)], capsys)
    assert code == EXIT_USER and "is a directory" in err
    out = tmp_path / "rows.jsonl"
    assert main(["eval", final, "--n", "2", "--output", str(out)]) == EXIT_OK
    assert len(out.read_text().splitlines()) == 2 and not list(tmp_path.glob(".rows.jsonl.tmp-*"))
