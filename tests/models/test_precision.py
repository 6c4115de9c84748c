"""Weights that never train (LoRA's base, the reference copy) in bfloat16 where its matrix products are native:
the CPU's flags are read at run time (/proc/cpuinfo), the rule is model.frozen_dtype's, and a LoRA run with a
bf16 base trains float32 adapters only; a full run's bf16 reference gives the float32 reference's log-probs within
bf16's rounding."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_hf import REWARDS, small_run

from grpo.config import load_config
from grpo.models import precision
from grpo.errors import ConfigError
from grpo.models.precision import (CPU_BF16_ENV, Bf16StoredLinear, cpu_bf16_flags, cpu_native_bf16, frozen_dtype,
                                   stores_linears_bf16)
from grpo.train.trainer import Trainer

MILAN = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma avx512f vaes\n\nprocessor\t: 1\nflags\t\t: fpu avx2\n"
GENOA = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n"


def test_native_bf16_is_read_from_the_cpu_flags(monkeypatch):
    assert not cpu_native_bf16(MILAN) and cpu_bf16_flags(MILAN) == []
    assert cpu_native_bf16(GENOA) and cpu_native_bf16(SAPPHIRE)
    assert cpu_bf16_flags(GENOA) == ["avx512_bf16"] and cpu_bf16_flags(SAPPHIRE) == ["amx_bf16"]
    assert not cpu_native_bf16("model name\t: avx512_bf16 in a name, not a flag\n")
    monkeypatch.delenv(CPU_BF16_ENV, raising=False)  # the suite's switch, when it is on, answers instead
    this_machine = open("/proc/cpuinfo").read()
    assert cpu_native_bf16() == ("avx512_bf16" in this_machine.split() or "amx_bf16" in this_machine.split())


@pytest.mark.parametrize("value, native", [("native", True), ("none", False), (" Native ", True)])
def test_the_switch_answers_instead_of_the_flags(value, native, monkeypatch):
    """GRPO_CPU_BF16 (the suite's switch, docs/guide.md) decides as if the CPU had or lacked native bf16, whatever
    /proc/cpuinfo says; a text given to the function is still read as flags."""
    monkeypatch.setenv(CPU_BF16_ENV, value)
    assert cpu_native_bf16() is native
    assert cpu_native_bf16(GENOA) and not cpu_native_bf16(MILAN)


def test_a_switch_of_another_value_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv(CPU_BF16_ENV, "yes")
    with pytest.raises(ConfigError, match="GRPO_CPU_BF16='yes'.*native.*none"):
        cpu_native_bf16()


@pytest.mark.parametrize("setting, device, native, want, stored", [
    ("auto", "cpu", False, torch.float32, False),
    ("auto", "cpu", True, torch.bfloat16, False),
    ("auto", "cuda", False, torch.bfloat16, False),
    ("float32", "cpu", True, torch.float32, False),
    ("bfloat16", "cpu", True, torch.bfloat16, False),
    ("bfloat16", "cuda", False, torch.bfloat16, False),
    ("bfloat16", "cpu", False, torch.float32, True),  # held in bf16, computed in float32
])
def test_frozen_dtype_rule(setting, device, native, want, stored, monkeypatch):
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda cpuinfo=None: native)
    cfg = load_config(None, [f"model.frozen_dtype={setting}"])
    assert frozen_dtype(cfg, torch.device(device), torch.float32) == want
    assert stores_linears_bf16(cfg, torch.device(device), torch.float32) == stored


def is_linear_weight(model, name: str) -> bool:
    """`name` is the weight of one of the model's linear layers but its head (the frozen bf16-held ones)."""
    module = model.get_submodule(name.rsplit(".", 1)[0])
    return name.endswith(".weight") and isinstance(module, torch.nn.Linear) and "lm_head" not in name


@pytest.mark.parametrize("native", [True, False])
def test_lora_with_a_bf16_base_trains_float32_adapters_only(native, model_dirs, chat_data, tmp_path, monkeypatch):
    """Native bf16: the whole base in bf16. Without: its linear layers held in bf16 (Bf16StoredLinear), the rest
    (embedding, norms, biases) float32, the forward in float32."""
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda cpuinfo=None: native)
    cfg = load_config(None, small_run(model_dirs["qwen2"], chat_data, tmp_path / "run", "model.lora_rank=4",
                                      "model.frozen_dtype=bfloat16", "kl.coef=0.1", "train.steps=1"))
    trainer = Trainer(cfg, reward_functions=REWARDS)
    try:
        params = dict(trainer.policy.named_parameters())
        base = {k: p for k, p in params.items() if "lora_" not in k}
        adapters = {k: p for k, p in params.items() if "lora_" in k}
        assert base and all(not p.requires_grad for p in base.values())
        linear = {k for k in base if is_linear_weight(trainer.policy, k)}
        assert linear and linear != set(base)
        for k, p in base.items():
            assert p.dtype == (torch.bfloat16 if native or k in linear else torch.float32), k
        assert adapters and all(p.dtype == torch.float32 and p.requires_grad for p in adapters.values())
        before = {k: p.detach().clone() for k, p in params.items()}
        result = trainer.step()
        assert result.metrics["policy/grad_norm"] > 0
        changed = {k for k, p in trainer.policy.named_parameters() if not torch.equal(before[k], p.detach())}
        assert changed and all("lora_" in k for k in changed)
    finally:
        trainer.close()


@pytest.mark.parametrize("native", [True, False])
def test_a_bf16_reference_gives_the_float32_references_log_probs(native, model_dirs, chat_data, tmp_path,
                                                                  monkeypatch):
    """Full fine-tuning, kl.coef > 0: the reference copy in bf16 (half the bytes), its log-probs of a sampled batch
    within bf16's rounding of the float32 copy's, computed here by a direct forward of the initial model."""
    from grpo.train.update import batch_logprobs

    monkeypatch.setattr(precision, "cpu_native_bf16", lambda cpuinfo=None: native)
    runs = {}
    for dtype in ("bfloat16", "float32"):
        cfg = load_config(None, small_run(model_dirs["llama"], chat_data, tmp_path / dtype, "kl.coef=0.1",
                                          f"model.frozen_dtype={dtype}"))
        trainer = Trainer(cfg, reward_functions=REWARDS)
        runs[dtype] = trainer
    try:
        ref = runs["bfloat16"].ref.model
        ref_params = dict(ref.named_parameters())
        assert ref_params and any(is_linear_weight(ref, k) for k in ref_params)
        for k, p in ref_params.items():  # without native bf16: the linear layers held in bf16, the rest float32
            assert p.dtype == (torch.bfloat16 if native or is_linear_weight(ref, k) else torch.float32), k
        assert all(p.dtype == torch.float32 for p in runs["bfloat16"].policy.parameters())  # the policy trains fp32
        scored = runs["float32"].rollouts.next(0)
        batch = runs["float32"]._policy_batch(scored.rollouts)
        out = {}
        for dtype, trainer in runs.items():
            with trainer.ref.active() as ref:
                out[dtype] = batch_logprobs(ref, batch, 10_000, 1.0)
        m = batch.mask.bool()
        gap = (out["bfloat16"][m] - out["float32"][m]).abs()
        assert gap.max() < 0.1 and gap.max() > 0  # bf16 rounds (about 3 significant digits); not the same tensor
    finally:
        for trainer in runs.values():
            trainer.close()


def test_a_bf16_file_loads_as_float32_with_the_same_values_and_tied_head(tmp_path):
    """load_policy converts a model loaded in its file's dtype (bfloat16 here) one parameter at a time: every value
    is the file's exactly (bf16 -> fp32 is exact), the head's tie is the config's, config.dtype is float32."""
    from helpers.tiny_hf import save_tiny_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from grpo.models.loading import load_policy

    path = save_tiny_model(tmp_path / "fp32", "qwen2")
    bf16 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    bf16.save_pretrained(tmp_path / "bf16")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "bf16" / f).write_bytes((path / f).read_bytes())
    saved = load_file(tmp_path / "bf16" / "model.safetensors")
    assert all(t.dtype == torch.bfloat16 for t in saved.values())
    model, _ = load_policy(load_config(None, [f"model.name={tmp_path / 'bf16'}"]), tmp_path / "bf16")
    state = model.state_dict()
    assert all(state[k].dtype == torch.float32 and torch.equal(state[k], v.float()) for k, v in saved.items())
    assert model.config.dtype == torch.float32
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied == bool(model.config.tie_word_embeddings)  # as the file says (the conversion keeps a tie)


def test_a_bf16_held_linear_computes_in_float32_from_its_rounded_weight():
    """Bf16StoredLinear against a hand reference: F.linear in float32 with the weight rounded to bf16. The same
    output and input/bias gradients; the weight gets none; the backward keeps the bf16 weight, never a float32
    copy of it (which F.linear(x, W.float()) would save: the memory the bf16 weights were to save)."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 40)
    held = Bf16StoredLinear.holding(linear)
    assert held.weight.dtype == torch.bfloat16 and not held.weight.requires_grad and held.bias is linear.bias
    x = torch.randn(3, 5, 48, requires_grad=True)
    rounded = linear.weight.detach().to(torch.bfloat16).float()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = held(x)
    assert all(t.dtype != torch.float32 or t.numel() != rounded.numel() for t in saved)
    assert any(t is held.weight for t in saved)
    x_ref = x.detach().clone().requires_grad_(True)
    bias_ref = linear.bias.detach().clone().requires_grad_(True)
    y_ref = torch.nn.functional.linear(x_ref, rounded, bias_ref)
    assert y.dtype == torch.float32 and torch.equal(y, y_ref)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    assert torch.allclose(x.grad, x_ref.grad, atol=1e-6) and torch.allclose(linear.bias.grad, bias_ref.grad, atol=1e-5)
    assert held.weight.grad is None


def test_a_bf16_held_lora_base_is_the_rounded_model_and_the_plan_counts_its_bytes(model_dirs, tmp_path,
                                                                                 monkeypatch):
    """model.frozen_dtype=bfloat16, LoRA, no native bf16: the policy's logits are those of the float32 model whose
    linear-layer weights (not the head's) were rounded to bf16 by hand (LoRA's B starts at 0), and the memory
    plan's weights are the loaded parameters' bytes exactly (linear layers at 2 bytes, the rest and the adapters
    at 4)."""
    from transformers import AutoModelForCausalLM

    from grpo.models.loading import load_policy
    from grpo.train import memory_plan

    monkeypatch.setattr(precision, "cpu_native_bf16", lambda cpuinfo=None: False)
    from grpo.train import memory_limit

    monkeypatch.setattr(memory_limit, "available_memory", lambda device: (64 * 2**30, "memory"))
    path = model_dirs["qwen2"]
    cfg = load_config(None, [f"model.name={path}", "model.lora_rank=4", "model.frozen_dtype=bfloat16"])
    policy, _ = load_policy(cfg, path)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rounded = 0
    with torch.no_grad():
        for name, module in reference.named_modules():
            if isinstance(module, torch.nn.Linear) and module is not reference.get_output_embeddings():
                module.weight.copy_(module.weight.to(torch.bfloat16).float())
                rounded += 1
    assert rounded >= 7  # q, k, v, o, gate, up, down of each layer
    ids = torch.randint(0, reference.config.vocab_size, (2, 12))
    with torch.no_grad():
        got, want = policy(input_ids=ids).logits, reference(input_ids=ids).logits
        plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)(input_ids=ids).logits
    assert got.dtype == torch.float32 and torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(plain, want, atol=1e-5)  # the rounding is seen: the check above can fail
    _, plan = memory_plan.plan_memory(cfg, path, torch.device("cpu"), torch.float32, 20)
    assert plan.parts["weights"] == sum(p.numel() * p.element_size() for p in policy.parameters())


def held_lora_policy(model_dirs, monkeypatch):
    from grpo.models.loading import load_policy

    monkeypatch.setattr(precision, "cpu_native_bf16", lambda cpuinfo=None: False)
    path = model_dirs["qwen2"]
    cfg = load_config(None, [f"model.name={path}", "model.lora_rank=4", "model.frozen_dtype=bfloat16"])
    policy, _ = load_policy(cfg, path)
    return policy


def test_the_ppo_critic_from_a_bf16_held_policy_trains_every_weight(model_dirs, monkeypatch):
    """PPO's critic copies the policy's backbone and trains all of it: its held linear layers come back as float32
    nn.Linear layers of the same values, and each gets a gradient. A held layer whose weight was made trainable
    refuses to run rather than train nothing."""
    from grpo.models.value import ValueModel

    policy = held_lora_policy(model_dirs, monkeypatch)
    held = [m for m in policy.modules() if isinstance(m, Bf16StoredLinear)]
    assert held
    critic = ValueModel.from_policy(policy)
    assert not any(isinstance(m, Bf16StoredLinear) for m in critic.modules())
    named = dict(critic.named_parameters())
    linear = {k: p for k, p in named.items() if p.dim() == 2 and ("proj" in k) and "lora_" not in k}
    assert linear and all(p.dtype == torch.float32 and p.requires_grad for p in linear.values())
    q = next(k for k in linear if "q_proj" in k)
    assert torch.equal(linear[q], held[0].weight.float())  # the first held layer is the first q_proj: same values
    ids = torch.randint(0, 200, (2, 6))
    critic(ids, torch.ones_like(ids)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in linear.values())
    held[0].weight.requires_grad_(True)
    with pytest.raises(RuntimeError, match="frozen"):
        held[0](torch.randn(1, held[0].in_features))


def test_merged_weights_of_a_bf16_held_base_are_float32_as_the_layer_computes(model_dirs, monkeypatch):
    """merged_state_dict (vLLM's weights, save_merged): a held layer with an adapter gives W (bf16, exact in
    float32) + (alpha/r) B A in float32, computed here by hand, not rounded back to bf16."""
    from grpo.models.lora import merged_state_dict

    policy = held_lora_policy(model_dirs, monkeypatch)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    merged = merged_state_dict(policy)
    layer = next(m for m in policy.modules() if hasattr(m, "lora_A") and isinstance(m.get_base_layer(),
                                                                                      Bf16StoredLinear))
    key = next(k for k, m in policy.get_base_model().named_modules() if m is layer) + ".weight"
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    want = layer.get_base_layer().weight.float() + layer.scaling["default"] * (b @ a)
    assert merged[key].dtype == torch.float32 and torch.allclose(merged[key], want.detach(), atol=1e-6)
    assert not torch.equal(merged[key], merged[key].to(torch.bfloat16).float())  # not rounded to bf16
