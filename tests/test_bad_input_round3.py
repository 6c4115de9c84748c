"""Issue 41, bad input and faults round three, row by row through the real entry point (`grpo.cli.main`): the LOST
rows (final/ and best/ are exactly their step's model; a full disk at the first write, a periodic save and the final
save is one message naming the disk and the place, nothing half-written, the last checkpoint kept) and issue 42's
item 6 (identical weights stored once, files 0644). The other rows are tests/test_bad_input_round3_inputs.py.

A full disk is real where it can be: a 8 MiB tmpfs mounted for the test (root only) and filled with a file at the
moment the row names."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
import torch
from helpers.tree import tree_digest
from test_bad_input import model_dir, run, small  # noqa: F401 (model_dir: the module's fixture)

import grpo.train.checkpoint.save as ckpt
from grpo.errors import EXIT_FAILURE, EXIT_OK
from grpo.train.checkpoint import load_checkpoint


@contextlib.contextmanager
def small_disk(path: Path, size: str = "8m"):
    """A tmpfs of `size` mounted at `path` (unmounted after), so that a full disk is a real ENOSPC."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path) -> None:
    """Write zeros to `disk/filler` until the disk is full."""
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC


def logits(model_path: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    with torch.no_grad():
        return model(torch.arange(1, 9)[None]).logits


# ---------------------------------------------------------------- LOST: final/ is exactly the model of its step


def test_final_after_a_resume_with_save_merged_switched_off_is_the_adapter_alone(model_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    lora = ["model.lora_rank=4", "optim.lr=0.05", "reward.functions=[test_varied]"]  # a varied reward, a large
    # step: the LoRA delta shows in the logits
    code, _ = run(small(model_dir, run_dir, *lora, "model.save_merged=true"), capsys)
    assert code == EXIT_OK and (run_dir / "final" / "model.safetensors").is_file()
    merged = logits(run_dir / "final")  # base + delta: the trained model
    assert not torch.allclose(merged, logits(model_dir), atol=1e-4)  # the adapter did change the model
    code, _ = run([*small(model_dir, run_dir, *lora, "model.save_merged=false"), "--resume"], capsys)
    assert code == EXIT_OK
    names = sorted(p.name for p in (run_dir / "final").iterdir())
    assert "adapter_model.safetensors" in names and "model.safetensors" not in names, names  # no stale merge
    torch.testing.assert_close(logits(run_dir / "final"), merged, atol=1e-5, rtol=1e-5)  # the change once, not twice
    assert not [p for p in run_dir.iterdir() if p.name.startswith((".tmp-", ".old-"))]


# ---------------------------------------------------------------- LOST: a full disk


def test_disk_full_from_the_start_is_one_message_and_leaves_no_config(model_dir, tmp_path, capsys):
    with small_disk(tmp_path / "disk") as disk:
        run_dir = disk / "run"
        run_dir.mkdir()
        fill(disk)
        code, err = run(small(model_dir, run_dir), capsys)
        assert code == EXIT_FAILURE
        assert re.search(rf"the disk is full \(No space left on device\) on {disk} \(0 B free of 8.0 MiB; about "
                         rf"[0-9.]+ KiB needed\) while writing {run_dir / 'config.yaml'}", err), err
        assert list(run_dir.iterdir()) == []  # no 0-byte config.yaml: a rerun after freeing space is not refused
        (disk / "filler").unlink()
        code, err = run(small(model_dir, run_dir), capsys)
        assert code == EXIT_OK, err


def test_disk_full_at_a_periodic_save_keeps_the_last_checkpoint(model_dir, tmp_path, capsys, monkeypatch):
    saves = []

    def hook(stage):  # the disk fills up while step 2's checkpoint is being written
        if stage == "after_model":
            saves.append(stage)
            if len(saves) == 2:
                fill(disk)

    with small_disk(tmp_path / "disk") as disk:
        run_dir = disk / "run"
        monkeypatch.setattr(ckpt, "_fault_hook", hook)
        code, err = run(small(model_dir, run_dir, "train.steps=3", "train.save_every=1"), capsys)
        assert code == EXIT_FAILURE
        assert "the periodic checkpoint save at step 2 failed: saving checkpoint step 2 to " in err
        assert re.search(rf"the disk is full \(No space left on device\) on {disk} \([0-9.]+ \w+ free of 8.0 MiB; "
                         rf"about [0-9.]+ \w+ needed\) "
                         rf"while writing {run_dir / 'checkpoints' / 'step-000002'}", err), err
        assert f"The previous checkpoint is intact: {run_dir / 'checkpoints' / 'step-000001'}" in err
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000001"]  # nothing half-written
        assert load_checkpoint(run_dir / "checkpoints" / "step-000001").step == 1  # verified against its manifest


def test_disk_full_at_the_final_save_keeps_the_checkpoint_and_says_how_to_finish(model_dir, tmp_path, capsys,
                                                                                monkeypatch):
    def hook(stage):  # the step-2 checkpoint is committed, then the disk is full for final/
        if stage == "after_rename":
            fill(disk)

    with small_disk(tmp_path / "disk") as disk:
        run_dir = disk / "run"
        monkeypatch.setattr(ckpt, "_fault_hook", hook)
        code, err = run(small(model_dir, run_dir), capsys)
        assert code == EXIT_FAILURE
        assert re.search(rf"the disk is full \(No space left on device\) on {disk} \([0-9.]+ \w+ free of 8.0 MiB; "
                         rf"about [0-9.]+ \w+ needed\) "
                         rf"while writing {run_dir / 'final'} \(the final model \(step 2\); tried 2 time\(s\), a fresh "
                         r"directory each time\)", err), err
        assert "unexpected pos" not in err and "enforce fail" not in err
        assert f"The last committed checkpoint is intact: {run_dir / 'checkpoints' / 'step-000002'}" in err
        assert f"--output-dir {run_dir} --resume" in err
        assert not (run_dir / "final").exists()
        assert not [p.name for p in run_dir.rglob(".*")]  # no .tmp-final-* left
        assert load_checkpoint(run_dir / "checkpoints" / "step-000002").step == 2
        monkeypatch.setattr(ckpt, "_fault_hook", lambda stage: None)
        (disk / "filler").unlink()
        code, err = run([*small(model_dir, run_dir), "--resume"], capsys)  # space freed: final/ is written
        assert code == EXIT_OK, err
        torch.testing.assert_close(logits(run_dir / "final"), logits(run_dir / "checkpoints" / "step-000002"))


def test_the_final_save_is_retried_into_a_fresh_directory(model_dir, tmp_path, capsys, monkeypatch):
    import grpo.models.lora as lora

    real, calls = lora.save_final, []

    def flaky(model, directory, **kw):  # the first attempt writes half a file, then the disk is full
        calls.append(Path(directory))
        if len(calls) == 1:
            (Path(directory) / "model.safetensors").write_bytes(b"\0" * 100)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(model, directory, **kw)

    monkeypatch.setattr(lora, "save_final", flaky)
    run_dir = tmp_path / "run"
    code, err = run(small(model_dir, run_dir), capsys)
    assert code == EXIT_OK, err
    assert len(calls) == 2 and calls[0] != calls[1] and not calls[0].exists()  # a fresh directory, the first removed
    torch.testing.assert_close(logits(run_dir / "final"), logits(run_dir / "checkpoints" / "step-000002"))
    assert not [p.name for p in run_dir.rglob(".*")]


# ---------------------------------------------------------------- issue 42 item 6: the same weights once; modes


def test_final_and_the_last_checkpoint_share_identical_weights(model_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    code, err = run(small(model_dir, run_dir), capsys)
    assert code == EXIT_OK, err
    final = run_dir / "final" / "model.safetensors"
    step = run_dir / "checkpoints" / "step-000002" / "model.safetensors"
    assert final.read_bytes() == step.read_bytes()
    assert os.stat(final).st_ino == os.stat(step).st_ino  # one copy on disk, two names
    assert load_checkpoint(run_dir / "checkpoints" / "step-000002").step == 2  # the manifest still verifies
    from grpo.train.checkpoint.final import disk_report

    files = [p for p in run_dir.rglob("*") if p.is_file()]
    total = sum({(p.stat().st_ino): p.stat().st_size for p in files}.values())  # du: a linked file once
    ckpt_dir = run_dir / "checkpoints" / "step-000002"
    only_ckpt = sum(p.stat().st_size for p in ckpt_dir.rglob("*") if p.is_file() and p.stat().st_nlink == 1)
    optim = sum(p.stat().st_size for p in ckpt_dir.glob("optimizer.*.pt"))
    line = disk_report(run_dir)
    assert f"on disk: {total / 1024:.1f} KiB in {run_dir} (final/ " in line, (line, total)
    assert f"({optim / 1024:.1f} KiB of it optimizer state) are only for --resume: `rm -r {run_dir}/checkpoints/" \
           f"step-*` frees {only_ckpt / 1024:.1f} KiB" in line, line


def test_best_shares_the_weights_of_final_and_a_new_best_leaves_final_alone(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo.models.lora import save_final
    from grpo.train.checkpoint.best import save_best
    from grpo.train.checkpoint.final import publish_dir

    model, tok = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    run_dir = tmp_path / "run"
    publish_dir(run_dir / "final", lambda d: save_final(model, d), what="final")
    best = save_best(model, tok, run_dir, 2, 0.5, 0.5)
    assert os.stat(best / "model.safetensors").st_ino == os.stat(run_dir / "final" / "model.safetensors").st_ino
    before = tree_digest(run_dir / "final")
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # a later, different best: its own file; final/ is not touched
    best = save_best(model, tok, run_dir, 3, 0.6, 0.6)
    assert os.stat(best / "model.safetensors").st_ino != os.stat(run_dir / "final" / "model.safetensors").st_ino
    assert tree_digest(run_dir / "final") == before


def test_saved_weights_are_readable_like_the_other_files(model_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    code, err = run(small(model_dir, run_dir), capsys)
    assert code == EXIT_OK, err
    mask = os.umask(0)
    os.umask(mask)
    want = 0o666 & ~mask
    for p in [run_dir / "final" / "model.safetensors", run_dir / "checkpoints" / "step-000002" / "model.safetensors",
              run_dir / "config.yaml"]:
        assert stat.S_IMODE(p.stat().st_mode) == want, (p, oct(p.stat().st_mode))
