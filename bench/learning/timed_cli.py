"""`python -m grpo.cli ...` with two more metrics per step: perf/step_cpu_s, this process's CPU seconds in the step
(all threads), and bench/sampled_completions, the completions generated in the step (dapo's resampling rounds
included). Wall time moves with whatever else the machine runs; CPU time hardly does. The benchmark runs the
library through this file so that its figures per CPU minute and the minimal example's are measured alike; the
training itself is exactly the CLI's.

    python bench/learning/timed_cli.py train grpo model.name=DIR ...

GRPO_BENCH_NO_BOS=1 is an ablation, not a setting: every prompt is tokenized with add_special_tokens=False, as the
library did before grpo.tokens (a BOS-adding checkpoint then sees prompts without BOS in RL, never at inference).
"""

from __future__ import annotations

import sys
import time


def _without_special_tokens() -> None:
    """Patch grpo.tokens before any module imports its functions: every text counts as templated."""
    import grpo.tokens as tokens

    text_token_ids = tokens.text_token_ids

    def no_bos(tokenizer, texts, templated=False, **kwargs):
        return text_token_ids(tokenizer, texts, True, **kwargs)

    tokens.text_token_ids = no_bos
    tokens.prompt_token_ids = lambda tokenizer, prompts: no_bos(tokenizer, [p.text for p in prompts])


def main() -> int:
    import os

    if os.environ.get("GRPO_BENCH_NO_BOS") == "1":
        _without_special_tokens()
    from grpo.cli import main as cli_main
    from grpo.train.trainer import Trainer

    step, generate = Trainer.step, Trainer._generate

    def counted_generate(self, prompts, G, round_):
        self._bench_sampled = getattr(self, "_bench_sampled", 0) + len(prompts) * G
        return generate(self, prompts, G, round_)

    def timed_step(self, *args, **kwargs):
        c, self._bench_sampled = time.process_time(), 0
        result = step(self, *args, **kwargs)  # a StepResult; the loop logs its metrics
        result.metrics["perf/step_cpu_s"] = time.process_time() - c
        result.metrics["bench/sampled_completions"] = float(self._bench_sampled)
        return result

    Trainer._generate, Trainer.step = counted_generate, timed_step
    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
