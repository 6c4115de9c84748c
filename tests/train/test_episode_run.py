"""A training run with multi-turn episodes: env/ metrics counted as defined, the transcript and the environment's
reward reach the scoring, samples.jsonl and the report show every turn marked policy or environment."""

from __future__ import annotations

import json

import torch
from train_helpers import eos_logit

from grpo.envs.base import EnvReply
from grpo.tracking.metrics import read_jsonl
from grpo.tracking.report import write_report


class OneToolReply:
    """Replies once with a tool result, then ends the episode (scored by the task's reward functions, or with
    `reward` when given)."""

    def __init__(self, prompt, reward=None):
        self.k, self.reward = 0, reward

    def step(self, turn):
        self.k += 1
        if self.k == 1:
            return EnvReply(message="<result>42</result>\n", tool_calls=1, tool_errors=0)
        return EnvReply(done=True, reward=self.reward)


def seen_columns(store):
    def reward(prompts, completions, messages=None, **kw):
        store.append(messages)
        return [0.0] * len(completions)

    reward.in_process = True
    return [("seen", reward, 1.0)]


def test_episode_metrics_samples_report_and_transcript(make_trainer):
    seen = []
    trainer = make_trainer("data.task=tools", "env.max_turns=3", "log.sample_groups=2", reward_functions=seen_columns(seen))
    trainer.env_factory = OneToolReply
    eos_logit(trainer, 50.0)  # every policy turn is just EOS: policy, tool, policy, done
    trainer.train()
    rows = [r for r in read_jsonl(trainer.run_dir / "metrics.jsonl") if "env/turns_mean" in r]
    assert rows and all(r["env/turns_mean"] == 2.0 and r["env/tool_calls_mean"] == 1.0 and
                        r["env/tool_errors_frac"] == 0.0 and r["env/truncated_frac"] == 0.0 for r in rows)
    msgs = seen[-1][0]  # the transcript column of the reward functions
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[2]["content"] == "<result>42</result>\n"
    sample = read_jsonl(trainer.run_dir / "samples.jsonl")[-1]
    roles = [t["role"] for t in sample["episodes"][0]["turns"]]
    assert roles == ["policy", "tool", "policy"]
    page = write_report(trainer.run_dir).read_text()
    assert "[policy]" in page and "[tool]" in page and "&lt;result&gt;42&lt;/result&gt;" in page
    assert "env/tool_calls_mean" in page


def test_environment_reward_replaces_the_reward_functions_and_limits_truncate(make_trainer):
    trainer = make_trainer("data.task=tools", "env.max_turns=3", reward_functions=seen_columns([]))
    trainer.env_factory = lambda p: OneToolReply(p, reward=0.75)
    eos_logit(trainer, 50.0)
    prompts = trainer.stream.next(2)
    rollouts = trainer.producer.generate(prompts, 2, trainer.step_count, 0)
    scores = trainer.producer.score(rollouts)
    assert torch.equal(scores.total, torch.full((4,), 0.75))
    batch = trainer._policy_batch(rollouts)  # loss on the two EOS tokens only; all 2 + reply + 1 attended
    reply = len(trainer.tokenizer("<result>42</result>\n", add_special_tokens=False)["input_ids"])
    assert batch.mask.sum(-1).tolist() == [2.0] * 4
    assert batch.attention_mask.sum(-1).tolist() == [2 + reply] * 4
    cut = make_trainer("data.task=tools", "env.max_turns=1", run_dir=trainer.run_dir.parent / "cut",
                       reward_functions=seen_columns([]))
    cut.env_factory = OneToolReply
    eos_logit(cut, 50.0)
    m = cut._rollout_metrics(cut.producer.generate(prompts, 2, cut.step_count, 0))
    assert m["env/truncated_frac"] == 1.0 and m["env/turns_mean"] == 1.0
    assert json.dumps(m)
