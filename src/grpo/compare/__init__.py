"""`grpo compare`: GRPO (beta = 0), GRPO (beta = 0.04) and PPO on the same work, each run in its own process.

    run.py     the parent: same-work checks, one worker process per run, the table and the plot
    worker.py  one run (`python -m grpo.compare.worker --worker SPEC`)
"""

from grpo.compare.run import RUNS, SAME_WORK, main
from grpo.compare.worker import state_bytes

__all__ = ["RUNS", "SAME_WORK", "main", "state_bytes"]
