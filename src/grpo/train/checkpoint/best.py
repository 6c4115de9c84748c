"""The best model by validation accuracy: `checkpoints/best/`, kept apart from the rotating `step-N` checkpoints.

A run's last model is not always its best (the default run once went 0.178 -> 0.588 at step 100 -> 0.528 at the
end). Each validation evaluation that beats every earlier one (the one before training included) writes the policy
to `checkpoints/best/` (`save_pretrained` model + tokenizer, loadable by `AutoModelForCausalLM.from_pretrained`, like
`final/`) with `best.json` = {"step", "eval/val_accuracy", "eval/accuracy"}: the validation accuracy it was chosen by,
and its accuracy on the test problems (measured once it was chosen, never used to choose). The directory is written under a temporary name and renamed
into place, so a kill leaves the previous best intact. `train.keep_checkpoints` never deletes it: rotation touches
`step-N` directories only. When no training step beats the starting model, there is no `best/` and the summary's
`eval/best_step` is 0 (the model of `model.name`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

BEST_DIR = "best"


def best_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints" / BEST_DIR


def read_best(run_dir: Path) -> dict | None:
    """best.json of run_dir's best model ({"step", "eval/val_accuracy", "eval/accuracy"}), or None."""
    path = best_dir(run_dir) / "best.json"
    return json.loads(path.read_text()) if path.is_file() else None


def save_best(policy, tokenizer, run_dir: Path, step: int, val_accuracy: float, test_accuracy: float, *,
              merged: bool = False, state_dict: dict | None = None) -> Path:
    """Write `policy` (+ tokenizer) as run_dir/checkpoints/best, replacing the previous best atomically.

    state_dict: the gathered full state dict under FSDP (grpo.parallel.full_state_dict), else None.
    """
    from grpo.models.lora import save_final

    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-best-*"):  # left by a kill during an earlier save
        shutil.rmtree(stale, ignore_errors=True)
    tmp, final = root / f".tmp-best-{os.getpid()}", best_dir(run_dir)
    save_final(policy, tmp, merged=merged, state_dict=state_dict)
    tokenizer.save_pretrained(tmp)
    (tmp / "best.json").write_text(json.dumps({"step": step, "eval/val_accuracy": val_accuracy,
                                               "eval/accuracy": test_accuracy}))
    aside = root / f".tmp-best-old-{os.getpid()}"
    if final.exists():
        os.rename(final, aside)
    os.rename(tmp, final)
    shutil.rmtree(aside, ignore_errors=True)
    return final
