"""`grpo train` (the CLI's main) with a test reward registered as `varied`; run alone or under torchrun:

    python tests/parallel/launch_train.py section.key=value ...
    torchrun --standalone --nproc_per_node=2 tests/parallel/launch_train.py section.key=value ...

`ARGS1 --then ARGS2 [--then ARGS3 ...]` runs the trainings one after the other in the same processes (e.g. a run, then its
--resume), saving a second launch.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a script, not under pytest: tests/ for helpers

import torch  # noqa: E402
from helpers.tiny_hf import varied_reward, varied_reward_rank1_worker_dies_once  # noqa: E402

from grpo.cli import main
from grpo.parallel import Dist
from grpo.rewards import register_reward

if __name__ == "__main__":
    torch.set_num_threads(1)
    register_reward("varied", varied_reward)
    register_reward("varied_rank1_worker_dies_once", varied_reward_rank1_worker_dies_once)
    args = sys.argv[1:]
    runs = [[]]
    for arg in args:  # ARGS1 --then ARGS2 --then ARGS3 ...
        if arg == "--then":
            runs.append([])
        else:
            runs[-1].append(arg)
    # Between runs the process group stays up: re-creating it in the same processes can read the previous
    # group's addresses from torchrun's store. Each run still builds its own Trainer (a resume reads the disk).
    Dist.close = lambda self: None
    for run in runs:
        code = main(["train", "--quiet", *run])
        if code:
            sys.exit(code)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
