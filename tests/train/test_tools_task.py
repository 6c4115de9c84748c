"""The built-in tool task learns that calling the calculator pays: a short GRPO run from the shipped warm model
raises the reward of episodes sampled on fixed training prompts (measured here, before and after, with the same
generator), and the share of episodes that call the tool."""

from __future__ import annotations

import torch

from grpo.config import load_config
from grpo.rollout.episodes import run_episodes
from grpo.train.trainer import Trainer


def sampled_reward(trainer, prompts, seed: int = 0) -> tuple[float, float]:
    """(mean correct reward, share of episodes with a tool call) of 4 episodes per prompt at temperature 1."""
    r = run_episodes(trainer.sampler, prompts, 4, trainer.env_factory, max_turns=trainer.cfg.env.max_turns,
                     max_tokens=trainer.cfg.env.max_tokens, generator=torch.Generator().manual_seed(seed))
    correct = [trainer.task.is_correct(prompts[i // 4], t) for i, t in enumerate(r.texts)]
    return sum(correct) / len(correct), sum(e["tool_calls"] > 0 for e in r.episodes) / len(r.episodes)


def test_reward_rises_in_a_short_run(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared CPU runs this faster on one thread
    try:
        run_and_check(tmp_path)
    finally:
        torch.set_num_threads(threads)


def run_and_check(tmp_path):
    cfg = load_config("tools", ["train.steps=12", "train.eval_every=0", "train.preflight=off", "optim.lr=3e-4",
 "log.progress=false", "log.plots=false",
                                f"train.output_dir={tmp_path / 'run'}", "train.seed=0"])
    trainer = Trainer(cfg)
    try:
        assert trainer.model_source == "shipped"
        trainer.producer.generate(trainer.train_prompts[:1], 2, 0, 0)  # builds the environment factory
        probe = trainer.task.split("train", 20000)[-24:]  # fixed prompts, at the end of the training split
        before, calls_before = sampled_reward(trainer, probe)
        for _ in range(cfg.train.steps):
            trainer.step()
        after, calls_after = sampled_reward(trainer, probe)
    finally:
        trainer.close()
    print(f"sampled reward {before:.3f} -> {after:.3f}, tool calls {calls_before:.3f} -> {calls_after:.3f}")
    assert calls_after > calls_before + 0.2, (calls_before, calls_after)
    assert after > before + 0.15, (before, after)
