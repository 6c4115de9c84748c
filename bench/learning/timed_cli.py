"""`python -m grpo.cli ...` with one more metric per step: perf/step_cpu_s, this process's CPU seconds in the step
(all threads). Wall time moves with whatever else the machine runs; CPU time hardly does. The benchmark runs the
library through this file so that its figures per CPU minute and the minimal example's are measured alike; the
training itself is exactly the CLI's.

    python bench/learning/timed_cli.py train grpo model.name=DIR ...
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    from grpo.cli import main as cli_main
    from grpo.train.trainer import Trainer

    step = Trainer.step

    def timed_step(self, *args, **kwargs):
        c = time.process_time()
        metrics = step(self, *args, **kwargs)
        metrics["perf/step_cpu_s"] = time.process_time() - c
        return metrics

    Trainer.step = timed_step
    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
