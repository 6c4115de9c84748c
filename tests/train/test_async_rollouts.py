"""rollout.mode=async (grpo.train.async_rollouts): a worker process samples ahead of the trainer, at most
rollout.max_staleness optimizer steps behind, and the update's pi_old is the policy that sampled.

What each test would catch: K=0 not giving sync's updates bitwise (a version published before the update, sampler
log-probs used as pi_old on a fresh batch, another random stream); a K=1 batch not sampled by the policy one step
back, or its pi_old not the sampler's log-probs; a dead or hung worker stalling the trainer; a worker's exception
changing type; episodes and DAPO not running; a checkpoint resuming after prompts that were only sampled ahead.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from train_helpers import deterministic, dies_in_worker_reward, new_trainer, wrong_count_reward

from grpo.config import ConfigError
from grpo.errors import RewardOutputError, RolloutWorkerError

pytestmark = pytest.mark.slow  # each async trainer spawns a worker process (a few seconds to import and load)

ASYNC = ("rollout.mode=async", "rollout.seed_per_prompt=true", "train.steps=3")  # the worker stops at train.steps


def spy_old_logprobs(monkeypatch) -> list:
    """The pi_old (batch.old_logp, or None) of every policy update from now on, in order."""
    from grpo.train import trainer as trainer_module

    seen, real_update = [], trainer_module.policy_update

    def spy(model, optimizer, scheduler, batch, cfg, dist, **kw):
        seen.append(None if batch.old_logp is None else batch.old_logp.clone())
        return real_update(model, optimizer, scheduler, batch, cfg, dist, **kw)

    monkeypatch.setattr(trainer_module, "policy_update", spy)
    return seen


def _steps(trainer, n: int) -> list:
    """n steps -> [(metrics, rollouts, parameters after the step)]."""
    out = []
    for _ in range(n):
        r = trainer.step()
        out.append((r.metrics, r.rollouts, {k: v.detach().clone() for k, v in trainer.policy.named_parameters()}))
    return out


@pytest.mark.parametrize("kl", ["kl.coef=0", "kl.coef=0.1"])
def test_max_staleness_zero_gives_the_sync_updates_bitwise(tiny_model_dir, tmp_path, kl):
    """kl.coef=0.1: pi_ref's log-probs come from the worker, those of sync from the trainer: the same numbers."""
    with deterministic():
        sync = new_trainer(tiny_model_dir, tmp_path / "sync", "rollout.seed_per_prompt=true", "train.steps=3", kl)
        asyn = new_trainer(tiny_model_dir, tmp_path / "async", *ASYNC, "rollout.max_staleness=0", kl)
        try:
            a, b = _steps(sync, 3), _steps(asyn, 3)
        finally:
            sync.close()
            asyn.close()
    for step, ((ma, ra, pa), (mb, rb, pb)) in enumerate(zip(a, b)):
        assert torch.equal(ra.completion_ids, rb.completion_ids), f"step {step}: other completions"
        assert ma["reward/mean"] == mb["reward/mean"]
        assert mb["rollout/staleness"] == 0.0
        for name in pa:
            assert torch.equal(pa[name], pb[name]), f"step {step}: parameter {name} differs"
    assert a[-1][2] != {} and not all(torch.equal(a[0][2][k], a[-1][2][k]) for k in a[0][2]), "nothing trained"


def test_max_staleness_one_samples_with_the_previous_policy_and_takes_its_logprobs_as_pi_old(
        tiny_model_dir, tmp_path, monkeypatch):
    from grpo.rollout.sampler import Sampler

    seen = spy_old_logprobs(monkeypatch)
    with deterministic():
        trainer = new_trainer(tiny_model_dir, tmp_path / "run", *ASYNC, "rollout.max_staleness=1")
        before = {k: v.detach().clone() for k, v in trainer.policy.named_parameters()}
        try:
            steps = _steps(trainer, 3)
        finally:
            trainer.close()
        staleness = [int(m["rollout/staleness"]) for m, _, _ in steps]
        # at most K: a worker that falls behind samples with newer weights (the newest published), never older ones
        assert staleness[0] == 0 and staleness[1] == 1 and staleness[2] in (0, 1), staleness
        versions = [before, steps[0][2], steps[1][2]]  # the policy after 0, 1, 2 updates
        for step in range(3):
            rollouts, version = steps[step][1], step - staleness[step]
            if staleness[step] == 0:
                assert seen[step] is None  # a fresh batch at mu = 1: pi_old is logp.detach(), as in sync mode
            else:
                mask = rollouts.completion_mask.float()
                assert torch.equal(seen[step], rollouts.logp * mask), "pi_old is not the sampler's log-probs"
                assert steps[step][0]["policy/ratio_mean"] != 1.0
            # the batch is what the policy of its version samples for its step (its generators), not the current one
            with torch.no_grad():
                for name, p in trainer.policy.named_parameters():
                    p.copy_(versions[version][name])
            cfg = trainer.cfg
            sampler = Sampler(trainer.policy, trainer.tokenizer, max_new_tokens=cfg.rollout.max_new_tokens,
                              temperature=cfg.rollout.temperature, top_p=1.0)
            gens = [trainer.dist.step_generator(cfg.train.seed, step, 0, p.uid) for p in rollouts.prompts]
            redo = sampler.generate(rollouts.prompts, cfg.rollout.group_size, generator=gens)
            assert torch.equal(redo.completion_ids, rollouts.completion_ids), f"step {step}: not version {version}'s"


def test_a_worker_killed_mid_run_stops_the_run_with_a_checkpoint_in_seconds(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ASYNC_KILL_AT", "3")  # the worker's 3rd reward call: step 2's batch
    monkeypatch.setenv("ASYNC_TRAINER_PID", str(os.getpid()))
    run_dir = tmp_path / "run"
    trainer = new_trainer(tiny_model_dir, run_dir, *ASYNC, "train.steps=5",
                          reward_functions=[("dies", dies_in_worker_reward, 1.0)])
    t = time.monotonic()
    try:
        with pytest.raises(RolloutWorkerError, match="killed"):
            trainer.train()
    finally:
        trainer.close()
    assert time.monotonic() - t < 120  # not a stall (the limit is a hang's bound, not a speed check)
    assert trainer.step_count == 2
    assert (run_dir / "checkpoints" / "step-000002").is_dir()


def test_a_hung_worker_is_stopped_after_worker_timeout_s(tiny_model_dir, tmp_path):
    trainer = new_trainer(tiny_model_dir, tmp_path / "run", *ASYNC, "rollout.worker_timeout_s=3",
                          "rollout.max_staleness=0")
    try:
        trainer.step()
        os.kill(trainer.rollouts.proc.pid, signal.SIGSTOP)  # a hang: alive, producing nothing
        t = time.monotonic()
        with pytest.raises(RolloutWorkerError, match="worker_timeout_s=3"):
            trainer.step()
        assert time.monotonic() - t >= 3
        assert trainer.rollouts.proc is None  # killed, not left behind
    finally:
        trainer.close()


def test_an_error_in_the_worker_is_raised_as_it_was(tiny_model_dir, tmp_path):
    trainer = new_trainer(tiny_model_dir, tmp_path / "run", *ASYNC,
                          reward_functions=[("short", wrong_count_reward, 1.0)])
    try:
        with pytest.raises(RewardOutputError, match="short"):
            trainer.step()
    finally:
        trainer.close()


def test_tool_episodes_and_dynamic_sampling_run_in_async_mode(tiny_model_dir, tmp_path):
    tools = new_trainer(tiny_model_dir, tmp_path / "tools", *ASYNC, "data.task=tools", "env.max_turns=2",
                        reward_functions=None)
    try:
        steps = _steps(tools, 2)
    finally:
        tools.close()
    assert all("env/turns_mean" in m for m, _, _ in steps) and steps[0][1].episodes is not None
    assert steps[1][0]["rollout/staleness"] == 1.0
    dapo = new_trainer(tiny_model_dir, tmp_path / "dapo", *ASYNC, "algo.drop_zero_std_groups=true",
                       "algo.max_resample_batches=3")
    try:
        steps = _steps(dapo, 2)
    finally:
        dapo.close()
    assert [m["rollout/staleness"] for m, _, _ in steps] == [0.0, 1.0]


def test_a_checkpoint_resumes_after_the_last_batch_trained_not_the_batches_sampled_ahead(tiny_model_dir, tmp_path):
    from grpo.train.checkpoint import load_checkpoint

    runs = {}
    for mode in ("sync", "async"):
        extra = ASYNC + ("rollout.max_staleness=2",) if mode == "async" else ()
        trainer = new_trainer(tiny_model_dir, tmp_path / mode, *extra, "train.steps=2", "train.save_every=1",
                              "eval.val_n=4")
        try:
            trainer.train()
        finally:
            trainer.close()
        runs[mode] = load_checkpoint(tmp_path / mode / "checkpoints" / "step-000001").trainer_state["stream"]
    assert runs["async"] == runs["sync"]  # the worker had drawn up to 3 batches ahead; the checkpoint has 1
    resumed = new_trainer(tiny_model_dir, tmp_path / "async", *ASYNC, "train.steps=4", "eval.val_n=4")
    try:
        summary = resumed.train(resume=True)
    finally:
        resumed.close()
    assert resumed.step_count == 4 and summary["steps"] == 4


def test_what_async_mode_cannot_do_is_refused_with_the_reason(tiny_model_dir, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="cannot be pickled"):
        new_trainer(tiny_model_dir, tmp_path / "a", *ASYNC,
                    reward_functions=[("local", lambda prompts, completions, **kw: [0.0] * len(completions), 1.0)])
    from grpo.config import load_config
    from grpo.parallel import SINGLE
    from grpo.train.async_rollouts import check_async_config

    with pytest.raises(ConfigError, match="rollout.engine=vllm is not supported"):
        check_async_config(load_config(None, ["rollout.mode=async", "rollout.engine=vllm"]), SINGLE, "cpu")
    with pytest.raises(ConfigError, match="CPU only"):
        check_async_config(load_config(None, ["rollout.mode=async"]), SINGLE, "cuda")
    monkeypatch.setenv("GRPO_ROLLOUT_WORKER", "1")  # a script without a __main__ guard, imported by the worker
    with pytest.raises(RuntimeError, match="__main__"):
        new_trainer(tiny_model_dir, tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_top_p_below_one_takes_pi_old_from_the_full_distribution(tiny_model_dir, tmp_path, monkeypatch):
    """With top-p the sampler's log-probs are of the truncated distribution; the worker computes the full one."""
    seen = spy_old_logprobs(monkeypatch)
    trainer = new_trainer(tiny_model_dir, tmp_path / "run", *ASYNC, "rollout.top_p=0.5")
    try:
        steps = _steps(trainer, 2)
    finally:
        trainer.close()
    rollouts = steps[1][1]
    mask = rollouts.completion_mask.float()
    assert seen[0] is None and seen[1] is not None
    # the truncated distribution gives every kept token more mass: the full one's log-probs are lower
    assert bool(((seen[1] - rollouts.logp * mask) * mask <= 1e-6).all())
    assert float(((rollouts.logp - seen[1]) * mask).sum()) > 0


def test_behaviour_logprobs_of_a_batch_padded_wider_than_its_samples():
    """Several processes pad every rank's batch to the widest rank's completions (parallel.align_batch): the
    sampler's (N, T) log-probs are padded to the batch's width and masked."""
    from types import SimpleNamespace

    from grpo.train.rollout_source import ScoredBatch, behaviour_logprobs

    logp = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    scored = ScoredBatch(SimpleNamespace(logp=logp), None, 0.0, 0.0, policy_version=0)
    expected = torch.tensor([[-1.0, -2.0, -3.0, 0.0, 0.0], [-4.0, -5.0, 0.0, 0.0, 0.0]])
    assert torch.equal(behaviour_logprobs(scored, mask), expected)
    scored.behaviour_logp = logp * 2  # top_p < 1: the full distribution's, computed in the worker
    assert torch.equal(behaviour_logprobs(scored, mask), expected * 2)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_with_a_kl_term_the_worker_sends_the_initial_models_logprobs_as_pi_ref(tiny_model_dir, tmp_path, monkeypatch,
                                                                               lora):
    """kl.coef > 0 in async mode: the worker holds pi_ref (the model directory's weights; LoRA: the adapter-disabled
    policy) and computes its log-probs of each batch while the trainer updates; the trainer holds no reference. Each
    update's batch.ref_logp equals the initial model's log-probs of the sampled tokens, by a loop over the rows here:
    2 steps, then a resumed third (its worker starts from the step-2 weights, so a reference taken from the first
    published weights, or one that followed them, differs there)."""
    from transformers import AutoModelForCausalLM

    from grpo.train import trainer as trainer_module

    seen, real_update = [], trainer_module.policy_update

    def spy(model, optimizer, scheduler, batch, cfg, dist, **kw):
        seen.append((batch.prompt_ids.clone(), batch.prompt_mask.clone(), batch.completion_ids.clone(),
                     batch.mask.clone(), batch.ref_logp.clone()))
        return real_update(model, optimizer, scheduler, batch, cfg, dist, **kw)

    monkeypatch.setattr(trainer_module, "policy_update", spy)
    extra = ["kl.coef=0.1", "optim.lr=0.01", "optim.warmup_steps=0", "train.save_every=1", "eval.val_n=4",
             *(["model.lora_rank=4"] if lora else [])]
    for steps, resume in ((2, False), (3, True)):
        trainer = new_trainer(tiny_model_dir, tmp_path / "run", *ASYNC, *extra, f"train.steps={steps}")
        try:
            assert trainer.ref is None
            before = {k: v.detach().clone() for k, v in trainer.policy.named_parameters()}
            trainer.train(resume=resume)
            moved = any(not torch.equal(before[k], v) for k, v in trainer.policy.named_parameters())
            temperature = trainer.cfg.rollout.temperature
        finally:
            trainer.close()
        assert moved, "the policy did not move"
    assert len(seen) == 3
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    G = len(seen[0][2]) // len(seen[0][0])
    for step, (prompt_ids, prompt_mask, completion_ids, mask, ref_logp) in enumerate(seen):
        expected = torch.zeros_like(ref_logp)
        for i in range(len(completion_ids)):
            prompt = prompt_ids[i // G][prompt_mask[i // G].bool()]
            n = int(mask[i].sum())
            ids = torch.cat([prompt, completion_ids[i, :n]])[None]
            with torch.no_grad():
                logits = initial(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / temperature
            expected[i, :n] = torch.log_softmax(logits, -1).gather(-1, completion_ids[i, :n, None])[:, 0]
        assert torch.allclose(ref_logp, expected, atol=1e-4), f"step {step + 1}: {(ref_logp - expected).abs().max()}"
