"""Peak RSS of one GRPO step with a reference model (kl.coef > 0), run as a script in a fresh process:

    python tests/models/rss_probe.py MODEL_DIR DATA.jsonl RUN_DIR MODE      MODE: lora | lora_copy | full | lora_noref

lora        LoRA, the reference = the policy with adapters disabled (what the trainer does)
lora_copy   LoRA, but the reference forced to a frozen full copy (what it would cost without the trick)
full        full fine-tuning, reference = frozen copy (plus gradients and AdamW state of every weight)
lora_noref  LoRA with kl.coef = 0 (no reference at all): the floor
Prints one JSON line: mode, peak_rss_mb, params_mb (the base weights), base_copies (modules holding them).
"""

from __future__ import annotations

import gc
import json
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a script, not under pytest: tests/ for helpers


def main(model_dir: str, data: str, run_dir: str, mode: str) -> dict:
    import torch
    from helpers.tiny_hf import REWARDS, small_run

    import grpo.models.lora as lora
    from grpo.config import load_config
    from grpo.train.trainer import Trainer

    torch.set_num_threads(1)
    extra = {"lora": ["model.lora_rank=8", "kl.coef=0.04"], "lora_copy": ["model.lora_rank=8", "kl.coef=0.04"],
             "full": ["kl.coef=0.04"], "lora_noref": ["model.lora_rank=8", "kl.coef=0"]}[mode]
    if mode == "lora_copy":
        from grpo.models.lora import frozen_copy

        lora.reference_policy = lambda policy, cfg: lora.FrozenReference(frozen_copy(lora.unwrap(policy)))
        import grpo.train.trainer as trainer_module

        trainer_module.reference_policy = lora.reference_policy
    cfg = load_config(None, small_run(model_dir, data, run_dir, "train.steps=1", "eval.n=1", *extra))
    trainer = Trainer(cfg, reward_functions=REWARDS)
    trainer.step()
    gc.collect()
    base_cls = type(lora.unwrap(trainer.policy).get_base_model() if lora.is_peft(trainer.policy) else trainer.policy)
    copies = sum(1 for o in gc.get_objects() if type(o) is base_cls)
    params_mb = sum(p.numel() * p.element_size() for n, p in trainer.policy.named_parameters()
                    if "lora_" not in n) / 2**20
    trainer.close()
    return {"mode": mode, "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "params_mb": round(params_mb, 1), "base_copies": copies}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])))
