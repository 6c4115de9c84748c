"""Preflight (grpo.train.preflight): each verdict from hand-made numbers, the numbers measured on a real tiny
trainer (truncation, empty completions, constant and missing rewards, the log-prob gap), that it leaves the training
RNG stream alone, train.preflight=stop|warn|off in a run, and `grpo train --preflight`'s exit code."""

from __future__ import annotations

import re

import pytest
import torch

from train_helpers import eos_logit

from grpo.train.preflight import PreflightError, judge, measure, run_preflight

HEALTHY = {"groups": 4, "group_size": 8, "max_new_tokens": 32, "truncated_frac": 0.1, "zero_spread_frac": 0.25,
           "all_same_reward": None, "logp_gap": 0.001, "prompt_len_mean": 17.0, "prompt_len_max": 19,
           "completion_len_mean": 6.0, "completion_len_max": 12, "example": "42<eos>",
           "rewards": {"correct": {"mean": 0.4, "min": 0.0, "max": 1.0, "missing_frac": 0.0}}}


def stats(**change):
    s = {**HEALTHY, **change}
    if "rewards" in change:
        s["rewards"] = change["rewards"]
    return s


def levels(verdicts):
    return [v.level for v in verdicts]


def test_healthy_is_said_in_one_ok_verdict():
    v = judge(HEALTHY)
    assert levels(v) == ["ok"] and v[0].text.startswith("healthy: 10% truncated, 25% of groups with zero spread")


def test_truncation_verdicts_name_the_setting_and_a_value():
    v = judge(stats(truncated_frac=0.92, zero_spread_frac=0.75))
    assert levels(v) == ["fatal"]
    assert "92% of completions hit rollout.max_new_tokens=32: raise it (e.g. rollout.max_new_tokens=128)" in v[0].text
    v = judge(stats(truncated_frac=0.92, zero_spread_frac=0.25))  # cut off but still informative (a length reward)
    assert levels(v) == ["warn"] and "92% of completions hit rollout.max_new_tokens=32: raise it" in v[0].text
    assert levels(judge(stats(truncated_frac=0.5))) == ["warn"]
    v = judge(stats(truncated_frac=0.88, zero_spread_frac=0.5))  # issue 42: 88% cut off, then rewards of 0.000
    assert levels(v)[0] == "fatal" and "88% of completions hit rollout.max_new_tokens=32: raise it (e.g. " \
                                      "rollout.max_new_tokens=128)" in v[0].text
    assert levels(judge(stats(truncated_frac=0.5, zero_spread_frac=0.5)))[0] == "fatal"  # most: half and more
    assert levels(judge(stats(truncated_frac=0.49))) == ["ok"]


def test_every_reward_the_same_is_fatal():
    v = judge(stats(zero_spread_frac=1.0, all_same_reward=0.0,
                    rewards={"correct": {"mean": 0.0, "min": 0.0, "max": 0.0, "missing_frac": 0.0}}))
    assert levels(v) == ["fatal"]
    assert "all 32 sampled completions got the same reward 0" in v[0].text and "'42<eos>'" in v[0].text


def test_zero_spread_groups_warn_from_80_percent():
    v = judge(stats(zero_spread_frac=0.8))
    assert levels(v) == ["warn"] and "80% of the 4 sampled groups have zero reward spread" in v[0].text
    assert levels(judge(stats(zero_spread_frac=0.75))) == ["ok"]


def test_missing_rewards():
    none = {"mean": None, "min": None, "max": None, "missing_frac": 1.0}
    v = judge(stats(rewards={"correct": HEALTHY["rewards"]["correct"], "fmt": none}))
    assert levels(v) == ["fatal"] and "reward 'fmt' returned None for all 32 completions" in v[0].text
    v = judge(stats(rewards={"correct": {**HEALTHY["rewards"]["correct"], "missing_frac": 0.5}}))
    assert levels(v) == ["warn"] and "reward 'correct' returned None for 50% of the completions" in v[0].text


def test_a_constant_reward_beside_others_warns():
    const = {"mean": 0.0, "min": 0.0, "max": 0.0, "missing_frac": 0.0}
    v = judge(stats(rewards={"correct": HEALTHY["rewards"]["correct"], "format_ok": const}))
    assert levels(v) == ["warn"] and "reward 'format_ok' gave 0 to all 32 completions" in v[0].text


def test_logp_gap_and_empty_completions_warn():
    v = judge(stats(logp_gap=0.2))
    assert levels(v) == ["warn"] and "differ from the trainer's by 0.200 nats/token" in v[0].text
    assert levels(judge(stats(logp_gap=None))) == ["ok"]  # top-p: not measured
    v = judge(stats(completion_len_mean=1.0))
    assert levels(v) == ["warn"] and "completions are nearly empty" in v[0].text


def test_fatal_verdicts_come_first():
    v = judge(stats(logp_gap=0.2, truncated_frac=0.95, zero_spread_frac=0.9))
    assert levels(v) == ["fatal", "warn", "warn"]


# ------------------------------------------------------------------------------------------- measured
def constant(prompts, completions, **kw):
    return [1.0] * len(completions)


def nothing(prompts, completions, **kw):
    return [None] * len(completions)


def test_measure_on_a_real_trainer_matches_the_rollouts(make_trainer):
    """The numbers are those of the rollouts themselves, recomputed here by hand; the RNG and the prompt stream are
    untouched (the same draws follow with or without the check)."""
    trainer = make_trainer("train.preflight_groups=3")
    rng, stream = torch.get_rng_state(), trainer.stream.state_dict()
    s = measure(trainer, 3)
    assert torch.equal(torch.get_rng_state(), rng) and trainer.stream.state_dict() == stream
    assert s["groups"] == 3 and s["group_size"] == 2 and s["max_new_tokens"] == 6
    again = measure(trainer, 3)  # seeded by train.seed: the same sample each time
    assert again == s
    torch.manual_seed(trainer.cfg.train.seed)
    r = trainer.sampler.generate(trainer.train_prompts[:3], 2)
    assert s["truncated_frac"] == pytest.approx(float(r.truncated.float().mean()))
    lengths = [int(m.sum()) for m in r.completion_mask]
    assert s["completion_len_mean"] == pytest.approx(sum(lengths) / len(lengths))
    assert s["completion_len_max"] == max(lengths)
    want = [(sum(map(ord, c)) % 11) / 10 for c in r.texts]  # varied_reward, by hand
    assert s["rewards"]["test_varied"]["mean"] == pytest.approx(sum(want) / len(want))
    spread = [len(set(want[i:i + 2])) == 1 for i in range(0, 6, 2)]
    assert s["zero_spread_frac"] == pytest.approx(sum(spread) / 3)
    assert s["logp_gap"] < 1e-4  # sampler and trainer compute the same policy
    trainer.sampler.temperature = 0.3  # now they do not: the trainer scores at rollout.temperature=1
    assert measure(trainer, 3)["logp_gap"] > 100 * max(s["logp_gap"], 1e-6)


def test_measure_sees_truncation_empty_completions_constant_and_missing_rewards(make_trainer):
    trainer = make_trainer(reward_functions=[("const", constant, 1.0), ("none", nothing, 1.0)])
    handle = eos_logit(trainer, float("-inf"))  # never ends
    s = measure(trainer, 2)
    handle.remove()
    assert s["truncated_frac"] == 1.0 and s["completion_len_mean"] == 6.0
    assert s["rewards"]["const"] == {"mean": 1.0, "min": 1.0, "max": 1.0, "missing_frac": 0.0}
    assert s["rewards"]["none"]["missing_frac"] == 1.0 and s["rewards"]["none"]["mean"] is None
    assert s["zero_spread_frac"] == 1.0 and s["all_same_reward"] is None  # one reward missing on every sample
    texts = [v.text for v in judge(s)]
    assert any("hit rollout.max_new_tokens=6: raise it" in t for t in texts)
    assert any("reward 'none' returned None for all 4 completions" in t for t in texts)
    handle = eos_logit(trainer, 50.0)  # ends at once
    s = measure(trainer, 2)
    handle.remove()
    assert s["truncated_frac"] == 0.0 and s["completion_len_mean"] == 1.0
    assert any("nearly empty" in v.text for v in judge(s))


def test_stop_ends_a_run_that_cannot_learn_and_warn_trains(make_trainer, tmp_path, capsys):
    trainer = make_trainer("train.preflight=stop", reward_functions=[("const", constant, 1.0)])
    with pytest.raises(PreflightError, match="cannot learn"):
        trainer.train()
    out = capsys.readouterr().out
    assert re.search(r"preflight fatal: all \d+ sampled completions \((\d+) batches of 4 prompts\) got the same "
                     r"reward 1", out)
    assert "train.preflight=warn to train anyway" in out and "model that knows the domain (model.name)" in out
    assert not (tmp_path / "run" / "checkpoints").exists()  # stopped before step 1
    trainer = make_trainer("train.preflight=warn", reward_functions=[("const", constant, 1.0)],
                           run_dir=tmp_path / "warn")
    assert trainer.train()["steps"] == 2
    assert "preflight fatal" in capsys.readouterr().out
    trainer = make_trainer(run_dir=tmp_path / "healthy")
    report = run_preflight(trainer)
    assert not report.fatal and report.lines()[0].startswith("[grpo] preflight: 4 groups x 2 completions")


def test_the_check_does_not_change_what_the_run_trains_on(make_trainer, tmp_path):
    """With and without the preflight, the same parameters after 2 steps (bitwise)."""
    params = []
    for mode in ("off", "warn"):
        trainer = make_trainer(f"train.preflight={mode}", run_dir=tmp_path / mode)
        trainer.train()
        params.append([p.detach().clone() for p in trainer.policy.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*params))


def test_cli_preflight_exit_codes(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from grpo.cli import main

    (tmp_path / "r.py").write_text("def const(prompts, completions, **kw):\n    return [0.0] * len(completions)\n"
                                   "def varied(prompts, completions, **kw):\n"
                                   "    return [(sum(map(ord, c)) % 11) / 10 for c in completions]\n")
    monkeypatch.chdir(tmp_path)
    base = [f"model.name={tiny_model_dir}", "rollout.group_size=4", "rollout.max_new_tokens=6",
            "data.train_size=50", "eval.n=4"]
    assert main(["train", *base, "reward.functions=[r.py:const]", "--preflight", "--quiet"]) == 3  # EXIT_HEALTH
    out = capsys.readouterr().out
    assert re.search(r"preflight fatal: all 192 sampled completions \(12 batches of 4 prompts\) got the same reward 0",
                     out)  # 50 training rows: 12 batches of 4 prompts at most
    assert main(["train", *base, "reward.functions=[r.py:varied]", "--preflight", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "preflight rewards: varied: mean" in out and "preflight fatal" not in out
    assert not any(tmp_path.glob("runs/*/metrics.jsonl"))  # nothing trained


def one_in_fifty():
    """A reward right on 1 sample in 50, counted over every call: the first batches of a small preflight have none."""
    seen = [0]

    def rare(prompts, completions, **kw):
        out = [1.0 if (seen[0] + i) % 50 == 49 else 0.0 for i in range(len(completions))]
        seen[0] += len(completions)
        return out

    rare.in_process = True  # the count lives in this process (a forked child would start from 0 each call)
    return rare


def spread_fatal(report) -> bool:
    """A fatal verdict about the rewards' spread (not the truncation of a random tiny model)."""
    return any(v.level == "fatal" and ("same reward" in v.text or "had any reward spread" in v.text)
               for v in report.verdicts)


def test_a_rare_success_is_found_in_more_batches_and_never_is_fatal(make_trainer, tmp_path):
    """4 prompts x 2 completions a batch: the 1-in-50 reward pays on samples 50 and 100, in batches 7 and 13 (two
    prompts). With 16 batches allowed the preflight finds both (not fatal, 13 batches sampled); with 10 it finds
    one prompt only (one lucky prompt: fatal); with one batch, as before, every reward is 0 (fatal); a reward that
    never pays is fatal after all 16 batches."""
    rows = ("data.train_size=80", "train.preflight_groups=4")
    trainer = make_trainer(*rows, "train.preflight_batches=16", reward_functions=[("rare", one_in_fifty(), 1.0)])
    report = run_preflight(trainer)
    assert report.stats["batches"] == 13 and report.stats["spread_groups"] == 2
    assert not spread_fatal(report)  # (the random tiny model's truncation verdict is another matter)
    trainer = make_trainer(*rows, "train.preflight_batches=10", run_dir=tmp_path / "ten",
                           reward_functions=[("rare", one_in_fifty(), 1.0)])
    report = run_preflight(trainer)
    assert spread_fatal(report) and report.stats["spread_groups"] == 1
    assert any("only 1 of the 40 sampled prompts (10 batches) had any reward spread" in v.text for v in report.verdicts)
    trainer = make_trainer(*rows, "train.preflight_batches=1", run_dir=tmp_path / "one",
                           reward_functions=[("rare", one_in_fifty(), 1.0)])
    assert spread_fatal(run_preflight(trainer))
    trainer = make_trainer(*rows, "train.preflight_batches=16", run_dir=tmp_path / "never",
                           reward_functions=[("const", constant, 1.0)])
    report = run_preflight(trainer)
    assert spread_fatal(report) and report.stats["batches"] == 16 and report.stats["all_same_reward"] == 1.0


def test_merge_batches_pools_the_counts():
    from grpo.train.preflight import merge_batches

    a = stats(groups=4, zero_spread_frac=1.0, all_same_reward=0.0)
    b = stats(groups=2, zero_spread_frac=0.5, all_same_reward=None)
    m = merge_batches(a, b)
    assert (m["groups"], m["batches"], m["all_same_reward"]) == (6, 2, None)
    assert m["zero_spread_frac"] == pytest.approx((4 * 1.0 + 2 * 0.5) / 6)
    assert merge_batches(a, stats(groups=4, all_same_reward=1.0))["all_same_reward"] is None  # 0 here, 1 there
    assert merge_batches(a, stats(groups=4, all_same_reward=0.0))["all_same_reward"] == 0.0


def test_the_issue_command_stops_in_seconds_with_what_to_change(tmp_path, monkeypatch, capsys):
    """Single-digit multiplication on the built-in model (which only knows addition and subtraction): exit 3 before
    step 1, naming what the built-in model knows and what to change; nothing trained, nothing evaluated."""
    import json
    import random

    from grpo.cli import main

    rng = random.Random(0)
    rows = [(rng.randint(2, 9), rng.randint(2, 9)) for _ in range(200)]
    (tmp_path / "mult.jsonl").write_text("".join(json.dumps({"prompt": f"What is {a} * {b}?", "answer": str(a * b)})
                                                 + "\n" for a, b in rows))
    monkeypatch.chdir(tmp_path)
    code = main(["train", "data.path=mult.jsonl", "reward.functions=[exact_answer]", "--output-dir", "run"])
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert code == 3, out[-3000:]
    assert "the built-in model only knows addition and subtraction of numbers below 60" in out
    assert "model.name=DIR" in out and "rollout.group_size" in out and "train.preflight=warn" in out
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not any(
        '"step": 1' in line for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "final").exists()
