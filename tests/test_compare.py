"""`grpo compare`: three runs (GRPO beta=0, GRPO beta=0.04, PPO) in their own processes on the same work; every
field of compare.json, the table and the plot (tiny settings; the real numbers are in docs/compare.md)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from grpo import cli
from grpo.compare import RUNS, state_bytes

TINY_RUN = ("train.preflight=warn warmup.steps=2 warmup.batch_size=8 eval.n=4 rollout.prompts_per_step=2 rollout.group_size=2 "
            "rollout.max_new_tokens=6 data.train_size=64")
RUN_FIELDS = {"models_resident", "models", "model_state", "model_state_bytes", "peak_rss_mb", "step_s", "update_s",
              "accuracy_before", "accuracy_final", "completions_seen", "baseline", "reward", "per_seed"}


def test_state_bytes_counts_params_grads_and_optimizer_state():
    lin = torch.nn.Linear(3, 2)  # 8 float32 parameters = 32 bytes
    assert state_bytes(lin) == {"params": 32, "grads": 0, "optimizer": 0, "total": 32}
    opt = torch.optim.AdamW(lin.parameters())
    lin(torch.ones(1, 3)).sum().backward()
    opt.step()  # AdamW: exp_avg + exp_avg_sq (32 bytes each) + a 4-byte step per parameter tensor
    assert state_bytes(lin, opt) == {"params": 32, "grads": 32, "optimizer": 72, "total": 136}


@pytest.mark.slow
def test_compare_two_steps_json_has_every_field(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRPO_COMPARE_OVERRIDES", "eval.n=4")  # appended to the command line's overrides
    out_dir = tmp_path / "cmp"
    assert cli.main(["compare", *TINY_RUN.split(), "--steps", "2", "--json", "--output-dir", str(out_dir)]) == 0
    stdout = capsys.readouterr().out
    result = json.loads(stdout.strip().splitlines()[-1])  # --json prints the object last
    assert result == json.loads((out_dir / "compare.json").read_text())
    assert set(result["runs"]) == set(RUNS) == {"grpo", "grpo_kl", "ppo"}
    for name, run in result["runs"].items():
        assert RUN_FIELDS <= set(run), RUN_FIELDS - set(run)
        for key in ("model_state_bytes", "peak_rss_mb", "step_s", "accuracy_final"):
            assert math.isfinite(run[key]) and run[key] >= 0, (name, key)
        assert run["completions_seen"] == 2 * 2 * 2 and run["steps"] == 2
        assert [p["completions"] for p in run["per_seed"][0]["accuracy_curve"]] == [0, 8]
    runs = result["runs"]
    assert runs["grpo"]["models"] == ["policy"]
    assert runs["grpo_kl"]["models"] == ["policy", "reference"]
    assert runs["ppo"]["models"] == ["policy", "reference", "value"]
    assert [runs[k]["models_resident"] for k in ("grpo", "grpo_kl", "ppo")] == [1, 2, 3]
    assert runs["ppo"]["baseline"] == "value model (GAE)" and runs["grpo"]["baseline"] == "group mean"
    # parameter + gradient + AdamW state: the policy's 4x params, the critic the same again, the reference 1x
    pol = runs["grpo"]["model_state"]["policy"]
    assert pol["grads"] == pol["params"] and pol["optimizer"] >= 2 * pol["params"]
    assert runs["grpo"]["model_state_bytes"] <= 0.55 * runs["ppo"]["model_state_bytes"]
    assert result["ratios"]["to_ppo"]["grpo"]["model_state_bytes"] <= 0.55
    assert result["settings"]["rollout.group_size"] == 2 and result["completions_per_step"] == 4
    assert "same PromptStream" in result["prompt_matching"]
    # the same prompts at every step: the samples of step 1 hold the same prompts in every run
    first = {k: json.loads((out_dir / f"{k}-seed0" / "run" / "samples.jsonl").read_text().splitlines()[0])["prompt"]
             for k in RUNS}
    assert len(set(first.values())) == 1
    assert (out_dir / "plots" / "compare_accuracy.png").stat().st_size > 1000
    for text in ("models needed", "baseline source", "peak RSS", "seconds per step", "test accuracy", "PPO"):
        assert text in stdout
