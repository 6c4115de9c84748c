"""optim.name=adamw_8bit (train/optim.py): torchao's AdamW8bit with the configured settings. Its update against AdamW
written out by hand, its moments held in 8 bits as the memory plan counts them, its state through a checkpoint file
and back, the weights' version counters the vLLM engine reads, the schedule's learning rates, and the errors for a
missing package or compiler. torch.compile builds the step once per parameter shape: the tests keep to two shapes."""

from __future__ import annotations

import sys

import pytest
import torch

pytest.importorskip("torchao", reason="optim.name=adamw_8bit needs torchao (pip install 'grpo[torchao]')")

from grpo.config import load_config  # noqa: E402
from grpo.errors import ConfigError, MissingExtraError  # noqa: E402
from grpo.train import optim as optim_mod  # noqa: E402
from grpo.train.memory_plan import optimizer_bytes  # noqa: E402
from grpo.train.optim import build_optimizer  # noqa: E402


def optim_cfg(*overrides: str):
    return load_config(None, ["optim.name=adamw_8bit", *overrides]).optim


def model() -> torch.nn.Module:
    """A weight of 8,192 values (8-bit moments: >= 4,096 values, a multiple of the 256-value block) and a bias of 64
    (kept float32 by torchao)."""
    torch.manual_seed(0)
    return torch.nn.Linear(128, 64)


def adamw_by_hand(p0: torch.Tensor, grads: list[torch.Tensor], lrs: list[float], betas, weight_decay: float,
                  eps: float = 1e-8) -> torch.Tensor:
    """len(grads) AdamW steps (decoupled decay, bias-corrected moments) in float64, by loops."""
    b1, b2 = betas
    p, m, v = p0.double().clone(), torch.zeros_like(p0, dtype=torch.float64), torch.zeros_like(p0, dtype=torch.float64)
    for k, (g, lr) in enumerate(zip(grads, lrs), 1):
        g = g.double()
        p = p * (1 - lr * weight_decay)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        p = p - lr * (m / (1 - b1 ** k)) / ((v / (1 - b2 ** k)).sqrt() + eps)
    return p


def run_steps(net, opt, sched, grads: list[dict]):
    for g in grads:
        for name, p in net.named_parameters():
            p.grad = g[name].clone()
        opt.step()
        sched.step()


def gradients(net, steps: int, seed: int = 1) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    return [{n: torch.randn(p.shape, generator=gen) * (k + 1) for n, p in net.named_parameters()} for k in range(steps)]


def test_the_update_is_adamw_with_the_configured_settings_up_to_the_moments_rounding():
    """Six steps with warm-up 3 (lrs 1/3, 2/3, 1, 1, 1, 1 of 0.01), betas (0.5, 0.6), decay 5 (large, so that it
    shows): the 8-bit update is the hand-written AdamW's within 2% of its size; the default betas, no decay, or no
    warm-up are 5x farther."""
    net = model()
    p0 = {n: p.detach().clone() for n, p in net.named_parameters()}
    opt, sched = build_optimizer(net.parameters(), optim_cfg("optim.lr=0.01", "optim.warmup_steps=3",
                                                             "optim.betas=[0.5,0.6]", "optim.weight_decay=5"), 100)
    assert type(opt).__name__ == "AdamW8bit"
    grads = gradients(net, 6)
    run_steps(net, opt, sched, grads)
    lrs = [0.01 / 3, 0.02 / 3, 0.01, 0.01, 0.01, 0.01]

    def err(name, **kw):
        args = dict(lrs=lrs, betas=(0.5, 0.6), weight_decay=5.0) | kw
        want = adamw_by_hand(p0[name], [g[name] for g in grads], **args) - p0[name].double()
        got = net.state_dict()[name].double() - p0[name].double()
        return float((got - want).norm() / want.norm())

    for name in ("weight", "bias"):
        assert err(name) < 0.02, (name, err(name))
    assert err("weight", betas=(0.9, 0.99)) > 0.1
    assert err("weight", weight_decay=0.0) > 0.1
    assert err("weight", lrs=[0.01] * 6) > 0.1


def test_the_moments_are_held_in_8_bits_as_the_memory_plan_counts_them():
    net = model()
    opt, sched = build_optimizer(net.parameters(), optim_cfg(), 10)
    run_steps(net, opt, sched, gradients(net, 1))
    state = opt.state[net.weight]
    held = 0
    for key in ("exp_avg", "exp_avg_sq"):
        moment = state[key]
        assert moment.codes.dtype == torch.uint8 and moment.codes.numel() == net.weight.numel()
        held += moment.codes.numel() * moment.codes.element_size() + moment.scale.numel() * moment.scale.element_size()
    assert held == optimizer_bytes("adamw_8bit", net.weight.numel(), 4)  # codes + a float32 scale per 256 values
    assert optimizer_bytes("adamw", net.weight.numel(), 4) == 8 * net.weight.numel()
    assert type(opt.state[net.bias]["exp_avg"]) is torch.Tensor  # 64 values: float32, as the plan's rounding allows
    from grpo.bench.paired_learning import state_bytes  # what the learning benchmark reports

    assert state_bytes(opt) == held + 2 * 64 * 4 + 2 * 4  # + the bias's float32 moments + two float32 step counts


def test_its_state_goes_through_a_checkpoint_file_and_continues_the_same(tmp_path):
    """Save after two steps the way checkpoints do (torch.save of the state dict), load it with the checkpoint
    loader (weights_only) into a fresh optimizer and model, take the same third step: the same weights, bit for bit.
    A fresh optimizer without the state takes a different third step."""
    from grpo.train.checkpoint.files import _torch_load

    grads = gradients(model(), 3)
    net = model()
    cfg = optim_cfg("optim.lr=0.01", "optim.warmup_steps=0")
    opt, sched = build_optimizer(net.parameters(), cfg, 10)
    run_steps(net, opt, sched, grads[:2])
    torch.save(opt.state_dict(), tmp_path / "optimizer.policy.pt")
    torch.save(net.state_dict(), tmp_path / "weights.pt")
    run_steps(net, opt, sched, grads[2:])

    def resumed(with_state: bool):
        again = model()
        again.load_state_dict(torch.load(tmp_path / "weights.pt"))
        opt2, sched2 = build_optimizer(again.parameters(), cfg, 10)
        if with_state:
            opt2.load_state_dict(_torch_load(tmp_path / "optimizer.policy.pt"))
        run_steps(again, opt2, sched2, grads[2:])
        return again

    assert torch.equal(resumed(True).weight, net.weight) and torch.equal(resumed(True).bias, net.bias)
    assert not torch.equal(resumed(False).weight, net.weight)


def test_each_step_changes_what_the_engine_reads_as_the_weights_version():
    """The vLLM engine reloads the weights only when their version counters changed (rollout/vllm_engine.py
    param_versions). torch's fused AdamW does not bump them (build_optimizer adds a hook for it); torchao's compiled
    step does by itself: this fails if a torch or torchao version stops doing so."""
    from grpo.rollout.vllm_engine import param_versions

    net = model()
    opt, sched = build_optimizer(net.parameters(), optim_cfg(), 10)
    for step in range(2):
        before = param_versions(net)
        run_steps(net, opt, sched, gradients(net, 1, seed=step))
        after = param_versions(net)
        assert after["weight"] != before["weight"] and after["bias"] != before["bias"], step


def test_without_torchao_or_a_compiler_it_says_what_to_install(monkeypatch):
    net = model()
    monkeypatch.setitem(sys.modules, "torchao.optim", None)  # as if torchao were not installed
    with pytest.raises(MissingExtraError, match=r"optim.name=adamw_8bit needs torchao: pip install 'grpo\[torchao\]'"):
        build_optimizer(net.parameters(), optim_cfg(), 10)
    monkeypatch.delitem(sys.modules, "torchao.optim")
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(ConfigError, match="needs a C\\+\\+ compiler, and none was found"):
        build_optimizer(net.parameters(), optim_cfg(), 10)
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert optim_mod._cxx_compiler() is None


@pytest.mark.slow
def test_a_run_with_8bit_moments_trains_logs_and_checkpoints(tmp_path):
    """`grpo train optim.name=adamw_8bit` end to end on a tiny model: its metrics are plain numbers (torchao keeps the
    learning rate as a tensor: it once broke metrics.jsonl), and its checkpoint holds 8-bit moments."""
    import json

    from helpers.tiny_hf import save_tiny_model, small_run, write_chat_jsonl

    from grpo.cli import main
    from grpo.train.checkpoint import latest_checkpoint
    from grpo.train.checkpoint.files import _torch_load

    model_dir = save_tiny_model(tmp_path / "model", hidden=64, intermediate=128)
    run = tmp_path / "run"
    assert main(["train", *small_run(model_dir, write_chat_jsonl(tmp_path / "d.jsonl"), run, "optim.name=adamw_8bit",
                                     "train.save_every=1")]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["optim/lr"] for r in rows if "optim/lr" in r]
    assert lrs and all(type(x) is float and x == pytest.approx(0.01, rel=1e-6) for x in lrs)  # held in float32
    state = _torch_load(latest_checkpoint(run) / "optimizer.policy.pt")["state"]
    assert any(type(m).__name__ == "OptimState8bit" for s in state.values() for m in s.values())
