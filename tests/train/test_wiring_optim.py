"""Trainer-level wiring of the optimizer settings and the micro-batching: the applied update is AdamW's with
optim.lr, optim.betas, optim.weight_decay, the warm-up and optim.schedule (written out here), and splitting the
batch into micro-batches (optim.micro_batch_tokens) leaves the gradient that of the whole batch (global token and
sequence counts), for every aggregation and with the KL term."""

from __future__ import annotations

import copy

import pytest
import torch
from wiring_helpers import one_thread  # noqa: F401  (an autouse fixture)
from wiring_helpers import Setting, assert_matches, fixed_step, perturb_, reference_grad, rel, rows_of


def adamw(params: dict, grads: list[dict], *, lrs: list[float], betas, weight_decay: float, eps: float = 1e-8):
    """Parameters after len(grads) AdamW steps (decoupled weight decay, bias-corrected moments), by loops."""
    b1, b2 = betas
    out = {}
    for name, p in params.items():
        p = p.double().clone()
        m, v = torch.zeros_like(p), torch.zeros_like(p)
        for k, (g, lr) in enumerate(zip(grads, lrs), 1):
            g = g[name].double()
            p = p * (1 - lr * weight_decay)
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            p = p - lr * (m / (1 - b1 ** k)) / ((v / (1 - b2 ** k)).sqrt() + eps)
        out[name] = p
    return out


def test_the_update_is_adamw_with_the_configured_lr_betas_decay_and_warmup(make_trainer):
    """Two updates (algo.epochs=2) in the warm-up: learning rates 0.01 * 1/3 and 0.01 * 2/3."""
    s = Setting(epochs=2)
    trainer, spy, calls, initial = fixed_step(make_trainer, s, "optim.lr=0.01", "optim.warmup_steps=3",
                                              "optim.betas=[0.5,0.6]", "optim.weight_decay=0.1")
    after = {k: p.detach().double() for k, p in trainer.policy.named_parameters()}
    p0 = spy.params[0]
    want = adamw(p0, spy.grads, lrs=[0.01 / 3, 0.02 / 3], betas=(0.5, 0.6), weight_decay=0.1)
    default = adamw(p0, spy.grads, lrs=[0.01 / 3, 0.02 / 3], betas=(0.9, 0.99), weight_decay=0.0)
    no_warmup = adamw(p0, spy.grads, lrs=[0.01, 0.01], betas=(0.5, 0.6), weight_decay=0.1)

    def delta(x):
        return {k: x[k] - p0[k].double() for k in x}

    assert rel(delta(after), delta(want)) < 1e-4
    assert rel(delta(default), delta(want)) > 5e-2 and rel(delta(no_warmup), delta(want)) > 5e-2
    first = adamw(p0, spy.grads[:1], lrs=[0.01 / 3], betas=(0.5, 0.6), weight_decay=0.1)
    assert rel(delta({k: v.double() for k, v in spy.params[1].items()}), delta(first)) < 1e-4


@pytest.mark.parametrize("setting", [
    Setting(),
    Setting(aggregate="token_mean"),
    Setting(aggregate="seq_sum_norm"),
    Setting(kl_coef=0.5, kl_estimator="k3"),
], ids=lambda s: " ".join(s.overrides()) or "default")
def test_micro_batches_give_the_whole_batch_gradient(setting, make_trainer, precision):
    """optim.micro_batch_tokens=1: one completion row per micro-batch (each part of a group with its prompt computed
    once for it: eight forward/backward passes, one optimizer step)."""
    saved = {}

    def before(trainer):
        saved["ref"] = copy.deepcopy(trainer.policy)
        perturb_(trainer.policy, 0.06)

    trainer, spy, calls, initial = fixed_step(make_trainer, setting, "optim.micro_batch_tokens=1", before=before,
                                              precision=precision)
    rows = rows_of(calls[0])
    want = reference_grad(initial, rows, setting, G=4, ref_model=saved["ref"])
    # what a per-micro-batch normalisation would give: each half on its own counts, summed
    halves = [reference_grad(initial, rows[:4], setting, G=4, ref_model=saved["ref"]),
              reference_grad(initial, rows[4:], setting, G=4, ref_model=saved["ref"])]
    local = {k: halves[0][k] + halves[1][k] for k in want}
    assert_matches(spy.grads[0], want, local, precision)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_the_schedule_sets_each_updates_learning_rate(schedule, make_trainer):
    """train.steps=1 with algo.epochs=2: 2 updates in all, so the second runs at half the rate (linear: 1 - 1/2;
    cosine: (1 + cos(pi/2)) / 2), where optim.schedule=constant would keep the full rate."""
    trainer, spy, calls, initial = fixed_step(make_trainer, Setting(epochs=2), "train.steps=1", "optim.lr=0.01",
                                              f"optim.schedule={schedule}")
    after = {k: p.detach().double() for k, p in trainer.policy.named_parameters()}
    p0 = spy.params[0]

    def delta(x):
        return {k: x[k] - p0[k].double() for k in x}

    betas = (0.9, 0.99)
    want = adamw(p0, spy.grads, lrs=[0.01, 0.005], betas=betas, weight_decay=0.0)
    constant = adamw(p0, spy.grads, lrs=[0.01, 0.01], betas=betas, weight_decay=0.0)
    assert rel(delta(after), delta(want)) < 1e-4
    assert rel(delta(constant), delta(want)) > 5e-2


def test_the_optimizer_step_builds_no_parameter_sized_temporaries():
    """build_optimizer takes torch's fused AdamW on the CPU: torch's default per-parameter loop allocates two
    temporaries the size of each parameter in every step (sqrt of the second moment, then its quotient), 1 GiB at a
    0.5B model's embedding, at the step where the gradients are alive too. Fails with the default loop."""
    from torch.profiler import ProfilerActivity, profile

    from grpo.config import load_config
    from grpo.train.optim import build_optimizer

    param = torch.nn.Parameter(torch.randn(2000, 500))
    optimizer, _ = build_optimizer([param], load_config(None, []).optim, total_steps=10)
    for _ in range(2):  # the first step allocates the moments, which are state, not temporaries
        param.grad = torch.randn_like(param)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            optimizer.step()
    size = param.numel() * param.element_size()
    allocations = {e.name: e.cpu_memory_usage for e in prof.events() if e.name.startswith("aten::")
                   and e.cpu_memory_usage >= size / 2}
    assert allocations == {}


def test_each_optimizer_step_changes_what_the_engine_reads_as_the_weights_version():
    """The vLLM engine reloads the weights only when `param_versions` changed since its last sync. torch's fused
    AdamW writes the parameters without bumping their version counters, so without build_optimizer's hook the
    engine kept sampling from the first step's weights (CI: rollout/logp_diff 0.01 from step 2 on). A parameter
    without a gradient (skipped by the step) keeps its version."""
    from grpo.config import load_config
    from grpo.rollout.vllm_engine import param_versions
    from grpo.train.optim import build_optimizer

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    optimizer, _ = build_optimizer(list(model.parameters()), load_config(None, []).optim, total_steps=10)
    assert optimizer.defaults["fused"]  # the case the hook is for
    for step in range(2):
        before = param_versions(model)
        for p in model[0].parameters():
            p.grad = torch.randn_like(p)
        optimizer.step()
        after = param_versions(model)
        assert after["0.weight"] != before["0.weight"] and after["0.bias"] != before["0.bias"], step
        assert after["1.weight"] == before["1.weight"]
