"""The best model by validation accuracy: `checkpoints/best/`, kept apart from the rotating `step-N` checkpoints.

A run's last model is not always its best (the default run once went 0.178 -> 0.588 at step 100 -> 0.528 at the
end). Each validation evaluation that beats every earlier one (the one before training included) writes the policy
to `checkpoints/best/` (`save_pretrained` model + tokenizer, loadable by `AutoModelForCausalLM.from_pretrained`, like
`final/`) with `best.json` = {"step", "eval/val_accuracy", "eval/accuracy"}: the validation accuracy it was chosen by,
and its accuracy on the test problems (measured once it was chosen, never used to choose). The directory is written
fresh under a temporary name and renamed into place (final.py), so a kill leaves the previous best intact and no
file of an older best survives; a full disk is one DiskFullError naming the disk and the bytes needed.
`train.keep_checkpoints` never deletes it: rotation touches `step-N` directories only. When no training step beats
the starting model, there is no `best/` and the summary's `eval/best_step` is 0 (the model of `model.name`).
"""

from __future__ import annotations

import json
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
    """Write `policy` (+ tokenizer) as run_dir/checkpoints/best, replacing the previous best atomically: a fresh
    directory swapped in (grpo.train.checkpoint.final.publish_dir), its weights hard-linked to final/'s or the last
    step checkpoint's when identical.

    state_dict: the gathered full state dict under FSDP (grpo.parallel.full_state_dict), else None.
    """
    from grpo.models.lora import save_final
    from grpo.train.checkpoint.final import publish_dir

    def write(tmp: Path) -> None:
        save_final(policy, tmp, merged=merged, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        (tmp / "best.json").write_text(json.dumps({"step": step, "eval/val_accuracy": val_accuracy,
                                                   "eval/accuracy": test_accuracy}))

    from grpo.models.lora import saved_bytes
    from grpo.train.checkpoint.files import tokenizer_bytes

    run_dir = Path(run_dir)
    steps = sorted((run_dir / "checkpoints").glob("step-*"))
    return publish_dir(best_dir(run_dir), write, what=f"the best model (step {step})",
                       share_with=[run_dir / "final", *steps[-1:]],
                       needed=lambda: saved_bytes(policy, merged=merged) + tokenizer_bytes(tokenizer))
