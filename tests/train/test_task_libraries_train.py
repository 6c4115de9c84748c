"""A short Trainer run through the episode rollout on each task library: a verifiers environment defined here
(multi-turn, its rubric the reward) and a reasoning-gym task (its scorer the reward). Each step's rewards are
checked against values computed by hand from the sampled episodes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from helpers.tiny_hf import save_tiny_model  # noqa: E402

from grpo.config import load_config  # noqa: E402
from grpo.train.trainer import Trainer  # noqa: E402


def overrides(model_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return [f"model.name={model_dir}", f"train.output_dir={run_dir}", "train.steps=2", "train.eval_every=0",
            "eval.n=2", "rollout.prompts_per_step=2", "rollout.group_size=3", "rollout.max_new_tokens=6",
            "log.progress=false", "log.plots=false", "optim.lr=0.01", "optim.warmup_steps=0", "reward.timeout_s=30",
            "train.preflight=off", "data.train_size=200", *extra]


def eos_bias(trainer, bias: float):
    """Add `bias` to the EOS logit of every forward pass (sampling and training alike)."""
    eos = trainer.tokenizer.eos_token_id

    def hook(module, args, out):
        out = out.clone()
        out[..., eos] += bias
        return out

    return trainer.policy.get_output_embeddings().register_forward_hook(hook)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen2", "qwen2")


def test_a_verifiers_multi_turn_environment_trains_with_its_rubric_as_the_reward(model_dir, tmp_path):
    vf = pytest.importorskip("verifiers")
    if not hasattr(vf, "MultiTurnEnv"):
        pytest.skip("verifiers without the classic environment API (0.4+)")
    from datasets import Dataset
    from transformers import AutoTokenizer

    from grpo.envs.verifiers_env import VerifiersTask

    class TwoTurns(vf.MultiTurnEnv):
        """Answers every turn with 'Again.' (as the user); verifiers ends the episode after 2 turns."""

        def __init__(self, **kw):
            super().__init__(max_turns=2, **kw)

        async def env_response(self, messages, state, **kwargs):
            return [vf.UserMessage(content="Again.")]

    def chars(completion, **kw) -> float:
        """Characters the model wrote over the episode, up to 40, over 40."""
        return min(sum(len(m.content or "") for m in completion if m.role == "assistant"), 40) / 40

    rows = [{"question": f"Say {w}.", "answer": w} for w in ("hi", "yes", "no", "ok", "go", "up", "on", "in") * 3]
    env = TwoTurns(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[chars]))
    task = VerifiersTask(env, tokenizer=AutoTokenizer.from_pretrained(model_dir))
    trainer = Trainer(load_config(None, overrides(model_dir, tmp_path / "run", "env.max_turns=3")), task=task)
    hook = eos_bias(trainer, 4.0)  # turns end at EOS often enough that verifiers finishes some episodes
    ends = []
    try:
        for _ in range(2):
            result = trainer.step()
            metrics = result.metrics
            assert math.isfinite(metrics["loss/policy"]) and metrics["reward/missing_frac"] == 0.0
            r, total = result.rollouts, result.scores.total
            assert r.episodes is not None and len(r.episodes) == 6
            for i, ep in enumerate(r.episodes):
                policy = [t["text"] for t in ep["turns"] if t["role"] == "policy"]
                want = min(sum(len(t) for t in policy), 40) / 40  # the rubric, by hand, on the sampled turns
                assert total[i].item() == pytest.approx(want), ep
                ended_by_env = ep["end"] == "done"
                assert ended_by_env == (ep["env_reward"] is not None)
                if ended_by_env:
                    assert len(policy) == 2 and [t["text"] for t in ep["turns"] if t["role"] == "user"] == ["Again."]
            assert "env/turns_mean" in metrics
            ends += [ep["end"] for ep in r.episodes]
        # both paths ran: episodes verifiers ended (its rubric's reward, kept at the end) and episodes the rollout
        # cut (a turn without EOS: scored by replaying the turns)
        assert "done" in ends and "turn_limit" in ends, ends
        res = trainer.evaluate()  # greedy episodes on the held-out rows, judged by the rubric's pass_threshold
        assert res["n"] == len(res["episodes"]) == 2 and 0.0 <= res["accuracy"] <= 1.0
    finally:
        hook.remove()
        trainer.close()


def test_a_reasoning_gym_task_trains_with_its_scorer_as_the_reward(model_dir, tmp_path):
    pytest.importorskip("reasoning_gym")
    from grpo.data.reasoning_gym import ReasoningGymTask

    opts = ("{min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1, operators: ['+'], allow_negation: false, "
            "allow_parentheses: false}")
    cfg = load_config(None, overrides(model_dir, tmp_path / "run", "data.task=reasoning_gym:basic_arithmetic",
                                      f"data.task_options={opts}", "data.test_size=10",
                                      "data.task_system_prompt=direct"))
    trainer = Trainer(cfg)
    try:
        assert isinstance(trainer.task, ReasoningGymTask)
        for _ in range(2):
            metrics = trainer.step().metrics
        assert "reward/reasoning_gym" in metrics
        res = trainer.evaluate()
        want = [trainer.task.score("test", p.meta["rg_index"], c) == 1.0
                for p, c in zip(trainer.eval_prompts, res["completions"])]
        assert res["n"] == 2 and res["correct"] == want
        # the trainer's own reward runner, on hand-made answers to its training prompts
        prompts = trainer.train_prompts[:3]
        sums = [sum(int(x) for x in trainer.task.entry("train", p.meta["rg_index"])["question"]
                    .removeprefix("Calculate ").rstrip(".").split(" + ")) for p in prompts]
        completions = [f"<answer>{s}</answer>" for s in sums] + [f"<answer>{s + 1}</answer>" for s in sums]
        columns = {"answer": [p.answer for p in prompts] * 2, "rg_split": ["train"] * 6,
                   "rg_index": [p.meta["rg_index"] for p in prompts] * 2}
        res = trainer.rewards([p.text for p in prompts] * 2, completions, columns)
        assert res.per_function["reasoning_gym"].tolist() == [1.0] * 3 + [0.0] * 3
    finally:
        trainer.close()
