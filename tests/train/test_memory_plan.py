"""The memory plan (train/memory_plan.py) and what it is made of (models/footprint.py): parameter counts against the
model itself, the per-token activations extrapolated from one- and two-layer probes against a direct measurement of
the whole model, the micro-batch the plan chooses, its refusal naming the settings that fit, and the run's summary
holding the plan beside the measured peak."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.tiny_hf import save_tiny_model, small_run, write_chat_jsonl
from helpers.tiny_models import tiny_config, tiny_model

from grpo.config import load_config
from grpo.errors import ConfigError
from grpo.models.footprint import parameter_counts, saved_bytes_per_token
from grpo.train import memory_plan


def saved_by_whole_model(model, tokens: int, compute: str = "weights") -> int:
    """The reference: every distinct non-parameter storage autograd keeps in one training forward of the whole
    decoder stack (all its layers), summed; under bf16 compute, not the weights' cast copies (2-D, a weight's
    shape: the plan counts them apart)."""
    from grpo.models.compute import compute_context

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    shapes = {s for p in model.parameters() if p.dim() == 2 for s in (tuple(p.shape), tuple(p.shape)[::-1])}
    kept = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params and (compute == "weights" or tuple(t.shape) not in shapes):
            kept[s.data_ptr()] = s.nbytes()
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), compute_context(compute, torch.device("cpu")):
        out = model.model(input_ids=torch.randint(0, 50, (1, tokens)), use_cache=False)
    del out
    return sum(kept.values())


class Lora:
    lora_rank, lora_alpha, lora_dropout, lora_target_modules = 4, None, 0.0, "all-linear"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_parameter_counts_are_the_models_own(arch):
    fields = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=300, tie_word_embeddings=True)
    model = tiny_model(arch, **fields)
    counts = parameter_counts(tiny_config(arch, **fields))
    assert counts.total == counts.trainable == sum(p.numel() for p in model.parameters())  # tied head once
    untied = parameter_counts(tiny_config(arch, **{**fields, "tie_word_embeddings": False}))
    assert untied.total == counts.total + 300 * 48
    lora = parameter_counts(tiny_config(arch, **fields), Lora())
    # by hand: every linear layer of the 3 decoder layers gets A (r x in) and B (out x r); the head does not
    kv = 2 * 48 // 4
    shapes = [(48, 48), (48, kv), (48, kv), (48, 48), (48, 96), (48, 96), (96, 48)]  # q k v o gate up down
    want = 3 * sum(4 * (i + o) for i, o in shapes)
    assert lora.trainable == want and lora.total == counts.total + want


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_activations_per_token_extrapolate_to_the_whole_model(arch):
    """The probe builds one- and two-layer copies; its per-token figure for 6 layers equals a direct measurement of
    the 6-layer model (the head excluded in both: the plan counts it apart) within 5%."""
    fields = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=6, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=1000)
    config = tiny_config(arch, **fields)
    tokens = 64
    want = saved_by_whole_model(tiny_model(arch, **fields), tokens) / tokens
    got = saved_bytes_per_token(config, torch.float32)
    assert abs(got - want) / want < 0.05, (got, want)
    # a layer keeps at least its MLP's intermediate activations (gate, up, their product) in float32
    assert got > 6 * 3 * 160 * 4
    checkpointed = saved_bytes_per_token(config, torch.float32, checkpointing=True)
    assert checkpointed < got / 2
    half = saved_bytes_per_token(config, torch.bfloat16)
    assert abs(half - got / 2) / (got / 2) < 0.15  # bfloat16 activations: about half


def _cfg(model_dir, tmp_path, *extra):
    return load_config(None, small_run(model_dir, write_chat_jsonl(tmp_path / "d.jsonl"), tmp_path / "run", *extra))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("m") / "model", hidden=64, layers=2, intermediate=128)


def _limit(monkeypatch, available: int = 64 * 2**30) -> None:
    """This machine, as the plan sees it: `available` bytes this process could have (no cgroup)."""
    from grpo.train import memory_limit

    monkeypatch.setattr(memory_limit, "available_memory", lambda device: (available, "memory"))


def _gib(n: float) -> str:
    return f"train.memory_limit={n / 2**30!r}"


P, G, T, L = 2, 2, 8, 20  # small_run's batch; the plans below are given a 20-token longest prompt


def test_the_whole_batch_is_one_micro_batch_when_it_fits_and_the_user_wins(model_dir, tmp_path, monkeypatch):
    """With room, the micro-batch is the step's whole batch: P prompts once and P*G completions of T tokens, no more
    (a larger one would plan memory no step uses); the note says why; a user's micro-batch is kept, and one larger
    than the step is planned at the step's tokens, never refused for memory it will not use."""
    _limit(monkeypatch)
    cpu, printed = torch.device("cpu"), []

    class Console:
        def print(self, text, **kw):
            printed.append(text)

    cfg, plan = memory_plan.plan_memory(_cfg(model_dir, tmp_path), model_dir, cpu, torch.float32, L, Console())
    whole = P * L + P * G * T
    assert cfg.optim.micro_batch_tokens == plan.micro_batch_tokens == plan.step_tokens == whole
    assert "micro_batch_tokens" in cfg.optim.model_fields_set  # saved in config.yaml: a resume does the same
    assert cfg.model.gradient_checkpointing is False  # auto, resolved: not needed
    assert any(f"optim.micro_batch_tokens={whole} (from the memory plan: the whole batch fits in the 57.6 GiB limit"
               in line for line in printed), printed
    assert any("train.memory_limit=auto: 64.0 GiB available less a 6.4 GiB margin" in line for line in printed)
    chunk = cfg.optim.logprob_chunk_tokens * 260 * 4 * 3
    assert plan.parts["activations"] == int(whole * plan.per_token * memory_plan.ACTIVATION_SLACK) + chunk
    mine, plan77 = memory_plan.plan_memory(_cfg(model_dir, tmp_path, "optim.micro_batch_tokens=30"), model_dir, cpu,
                                           torch.float32, L)
    assert mine.optim.micro_batch_tokens == plan77.micro_batch_tokens == 30
    assert plan77.parts["activations"] == int(30 * plan.per_token * memory_plan.ACTIVATION_SLACK) + chunk
    big, plan_big = memory_plan.plan_memory(_cfg(model_dir, tmp_path, "optim.micro_batch_tokens=10000000"), model_dir,
                                            cpu, torch.float32, L)
    assert plan_big.parts["activations"] == plan.parts["activations"]  # the step's 72 tokens, not 10 million
    p = plan.parts  # the parts by hand: float32 weights, gradients, AdamW's two moments
    n = sum(x.numel() for x in tiny_model("qwen2", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                                          num_attention_heads=2, num_key_value_heads=1, vocab_size=260).parameters())
    assert (p["weights"], p["gradients"], p["optimizer"]) == (4 * n, 4 * n, 8 * n)
    assert plan.peak == (p["runtime"] + p["weights"] + p["optimizer"]
                         + max(p["gradients"] + p["activations"], p["generation"]))


def test_the_plan_counts_each_prompt_once_only_where_the_cache_shares_it(model_dir, tmp_path, monkeypatch):
    """The step's tokens: P prompts once and P*G completions where the model's KV cache can share a prompt across its
    group (plain layers; sliding-window ones, Gemma 3's and Mistral's), P*G*(L+T) where it cannot (the forward then
    repeats every prompt, models/forward.py completion_logits): the memory plan and the forward agree."""
    from grpo.models import forward

    _limit(monkeypatch)
    cpu = torch.device("cpu")
    _, plan = memory_plan.plan_memory(_cfg(model_dir, tmp_path), model_dir, cpu, torch.float32, L)
    assert plan.step_tokens == P * L + P * G * T
    gemma = tmp_path / "gemma3"  # sliding-window layers beside global ones: its config is all the plan reads
    tiny_config("gemma3", vocab_size=260, hidden_size=64, intermediate_size=128).save_pretrained(gemma)
    _, plan = memory_plan.plan_memory(_cfg(gemma, tmp_path), gemma, cpu, torch.float32, L)
    assert plan.step_tokens == P * L + P * G * T
    assert forward.config_shares_prompt(tiny_config("mistral"))
    monkeypatch.setattr(forward, "_shareable", lambda cache: False)  # a cache that cannot share
    _, plan = memory_plan.plan_memory(_cfg(model_dir, tmp_path), model_dir, cpu, torch.float32, L)
    assert plan.step_tokens == P * G * (L + T)


def test_a_tight_limit_takes_the_most_tokens_that_fit_then_checkpointing(model_dir, tmp_path, monkeypatch):
    """Below the whole batch, the micro-batch is the most tokens whose activations fit beside the rest of the plan;
    where not even one completion row (prompt + T) fits, gradient checkpointing (auto) is turned on, said in a note;
    an explicit model.gradient_checkpointing=false is then refused, naming what would fit."""
    _limit(monkeypatch)
    monkeypatch.setattr(memory_plan, "process_rss", lambda: 100 * 2**20)
    cpu = torch.device("cpu")
    _, roomy = memory_plan.plan_memory(_cfg(model_dir, tmp_path), model_dir, cpu, torch.float32, L)
    per, fixed = roomy.per_token * memory_plan.ACTIVATION_SLACK, roomy.fixed + roomy.parts["gradients"]
    chunk = roomy.parts["activations"] - int(roomy.step_tokens * per)
    limit = fixed + chunk + int(50 * per) + 1  # room for 50 tokens: more than a row (28), less than the step (72)
    cfg, plan = memory_plan.plan_memory(_cfg(model_dir, tmp_path, _gib(limit)), model_dir, cpu, torch.float32, L)
    assert plan.micro_batch_tokens == 50 and plan.peak <= limit and cfg.model.gradient_checkpointing is False
    printed = []

    class Console:
        def print(self, text, **kw):
            printed.append(text)

    tiny = fixed + chunk + int(10 * per)  # not even one 28-token row, but checkpointed tokens are cheaper
    cfg, plan = memory_plan.plan_memory(_cfg(model_dir, tmp_path, _gib(tiny), "train.memory_check=false"), model_dir,
                                        cpu, torch.float32, L, Console())
    assert cfg.model.gradient_checkpointing is True and plan.per_token < roomy.per_token
    assert plan.step_tokens == P * G * (L + T)  # checkpointed layers repeat each prompt
    assert any("model.gradient_checkpointing=true (from the memory plan" in line for line in printed)
    with pytest.raises(ConfigError, match="more than the .* limit"):
        memory_plan.plan_memory(_cfg(model_dir, tmp_path, _gib(tiny), "model.gradient_checkpointing=false"),
                                model_dir, cpu, torch.float32, L)


def test_a_plan_over_the_limit_is_refused_with_what_would_fit(model_dir, tmp_path, monkeypatch):
    _limit(monkeypatch)
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError) as e:
        memory_plan.plan_memory(_cfg(model_dir, tmp_path, "kl.coef=0.1", _gib(2**20)), model_dir, cpu, torch.float32,
                                L)
    msg = str(e.value)
    assert "memory plan: peak" in msg and "of the 0.0 GiB limit" in msg and "more than the 0.0 GiB limit" in msg
    assert "model.lora_rank=16" in msg and "kl.coef=0 (no reference copy" in msg
    assert "a larger train.memory_limit (this machine has 64.0 GiB available)" in msg
    assert "train.memory_check=false" in msg
    printed = []

    class Console:
        def print(self, text, **kw):
            printed.append(text)

    memory_plan.plan_memory(_cfg(model_dir, tmp_path, "train.memory_check=false", _gib(2**20)), model_dir, cpu,
                            torch.float32, L, Console())
    assert any("warning: the run's memory plan" in line for line in printed)


@pytest.mark.parametrize("extra, holders", [(["kl.coef=0.1"], 1), (["model.lora_rank=4"], 1),
                                            (["model.lora_rank=4", "kl.coef=0.1"], 1), ([], 0)])
def test_the_refusal_offers_a_bf16_base_where_frozen_weights_are_float32(extra, holders, model_dir, tmp_path,
                                                                         monkeypatch):
    """Without native bf16, frozen weights are float32: model.frozen_dtype=bfloat16 would hold their linear layers
    in bf16, 2 bytes a weight less, counted here by hand on the model (its linear layers but the head); LoRA's
    reference is its own base (one holder). Nothing is frozen in a full run without a reference: not offered."""
    from grpo.models import precision

    monkeypatch.setattr(precision, "cpu_native_bf16", lambda cpuinfo=None: False)
    _limit(monkeypatch, 2**20)
    model = tiny_model("qwen2", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2,
                       num_key_value_heads=1, vocab_size=260)
    linear = sum(m.weight.numel() for m in model.modules()
                 if isinstance(m, torch.nn.Linear) and m is not model.get_output_embeddings())
    cfg = _cfg(model_dir, tmp_path, "train.memory_check=false", *extra)
    _, plan = memory_plan.plan_memory(cfg, model_dir, torch.device("cpu"), torch.float32, 20)
    assert plan.bf16_base_saves == 2 * linear * holders
    fixes = memory_plan._fixes(plan, cfg)
    assert any(f.startswith("model.frozen_dtype=bfloat16") for f in fixes) == bool(holders)
    held = _cfg(model_dir, tmp_path, "train.memory_check=false", "model.frozen_dtype=bfloat16", *extra)
    _, after = memory_plan.plan_memory(held, model_dir, torch.device("cpu"), torch.float32, 20)
    assert after.bf16_base_saves == 0 and plan.floor - after.floor == 2 * linear * holders


def test_a_run_prints_its_plan_and_records_plan_and_peak(model_dir, tmp_path):
    from grpo.cli import main

    data = write_chat_jsonl(tmp_path / "d.jsonl")
    code = main(["train", *small_run(model_dir, data, tmp_path / "run")[:-1], "train.preflight=off", "--quiet"])
    assert code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["memory/planned_peak_mb"] > 0 and summary["memory/peak_rss_mb"] > 0
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert f"micro_batch_tokens: {summary['memory/micro_batch_tokens']}" in saved


def test_the_built_in_models_run_peaks_within_a_quarter_of_its_plan(tmp_path):
    """The built-in model's run with its defaults (the plan's micro-batch, train.memory_limit=auto): the measured
    peak of the process tree (summary.json) is within 25% of the plan printed at start, and within the limit."""
    from grpo.cli import main

    run = tmp_path / "run"
    assert main(["train", "train.steps=3", "eval.n=20", "eval.val_n=20", "log.plots=false", "--output-dir", str(run),
                 "--quiet"]) == 0
    s = json.loads((run / "summary.json").read_text())
    peak, planned = s["memory/peak_rss_mb"], s["memory/planned_peak_mb"]
    assert abs(peak - planned) <= 0.25 * planned, (peak, planned)
    assert peak <= s["memory/limit_mb"]


def test_auto_holds_the_frozen_linears_in_bf16_only_where_float32_would_not_fit(model_dir, tmp_path, monkeypatch):
    """model.frozen_dtype=auto, no native bf16, LoRA: with the memory between the two plans' peaks the run takes
    model.frozen_dtype=bfloat16 (said in a note, saved in cfg); with room for float32 it keeps float32; set to
    float32 by the user it is refused as before."""
    from grpo.models import precision

    monkeypatch.setattr(precision, "cpu_native_bf16", lambda cpuinfo=None: False)
    monkeypatch.setattr(memory_plan, "process_rss", lambda: 100 * 2**20)  # the plans differ by ~0.2 MB here
    cpu = torch.device("cpu")
    lora = ("model.lora_rank=4", "optim.micro_batch_tokens=64", "model.frozen_dtype=auto")  # the choice under test
    none = memory_plan.MemoryLimit(None, "test")
    _, fp32 = memory_plan._plan(_cfg(model_dir, tmp_path, *lora), model_dir, cpu, torch.float32, 20, T, none)
    _, held = memory_plan._plan(_cfg(model_dir, tmp_path, *lora, "model.frozen_dtype=bfloat16"), model_dir, cpu,
                                torch.float32, 20, T, none)
    assert held.peak < fp32.peak
    printed = []

    class Console:
        def print(self, text, **kw):
            printed.append(text)

    _limit(monkeypatch)
    between = (held.peak + fp32.peak) // 2
    cfg, plan = memory_plan.plan_memory(_cfg(model_dir, tmp_path, *lora, _gib(between)), model_dir, cpu,
                                        torch.float32, 20, Console())
    assert cfg.model.frozen_dtype == "bfloat16" and plan.peak == held.peak
    assert any("model.frozen_dtype=bfloat16 (from the memory plan" in line for line in printed)
    with pytest.raises(ConfigError, match="more than the .* limit"):
        memory_plan.plan_memory(_cfg(model_dir, tmp_path, *lora, "model.frozen_dtype=float32", _gib(between)),
                                model_dir, cpu, torch.float32, 20)
    cfg, plan = memory_plan.plan_memory(_cfg(model_dir, tmp_path, *lora, _gib(fp32.peak + 1)), model_dir, cpu,
                                        torch.float32, 20)
    assert cfg.model.frozen_dtype == "auto" and plan.peak == fp32.peak


def test_8bit_moments_are_counted_and_offered_where_the_moments_are_a_large_part(model_dir, tmp_path, monkeypatch):
    """optim.name=adamw_8bit: the moments are one byte a value plus a float32 scale per 256 (by hand), for each of the
    two; a refused full fine-tuning whose moments are a large part of the peak is offered the switch with its saving;
    LoRA (float32 adapters, small) is not."""
    cpu = torch.device("cpu")
    n = sum(x.numel() for x in tiny_model("qwen2", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                                          num_attention_heads=2, num_key_value_heads=1, vocab_size=260).parameters())
    _, plan = memory_plan.plan_memory(_cfg(model_dir, tmp_path, "optim.name=adamw_8bit"), model_dir, cpu,
                                      torch.float32, 20)
    assert plan.parts["optimizer"] == int(2 * n * (1 + 4 / 256))
    monkeypatch.setattr(memory_plan, "process_rss", lambda: 0)  # a small model: its moments beside no runtime
    monkeypatch.setattr(memory_plan, "RUNTIME_GROWTH", 0)
    _limit(monkeypatch)
    with pytest.raises(ConfigError) as e:
        memory_plan.plan_memory(_cfg(model_dir, tmp_path, "optim.micro_batch_tokens=1", _gib(2**10)), model_dir, cpu,
                                torch.float32, 20)
    saved = 8 * n - int(2 * n * (1 + 4 / 256))
    assert f"optim.name=adamw_8bit (8-bit AdamW moments, {saved / 2**30:.1f} GiB less" in str(e.value)
    with pytest.raises(ConfigError) as e:
        memory_plan.plan_memory(_cfg(model_dir, tmp_path, "optim.micro_batch_tokens=1", "model.lora_rank=4",
                                     _gib(2**10)), model_dir, cpu, torch.float32, 20)
    assert "optim.name=adamw_8bit" not in str(e.value)


@pytest.mark.parametrize("compute, cast", [("bfloat16", 2), ("bfloat16_emulated", 4)])
def test_bf16_compute_plans_its_activations_and_its_weight_copies(model_dir, tmp_path, compute, cast, monkeypatch):
    """model.compute_dtype=bfloat16 (or emulated) at one micro-batch size: the activations are that many tokens at
    the probe's bf16 cost, plus the cast copy of every linear weight (autocast's cache, measured in
    tests/models/test_compute.py) and the head's weight as its products take it, each counted by hand here."""
    from transformers import AutoConfig

    _limit(monkeypatch)
    cpu, tokens = torch.device("cpu"), 50  # fewer than the step's 72: this many are planned
    config = AutoConfig.from_pretrained(model_dir)
    fp32_cfg, fp32 = memory_plan.plan_memory(_cfg(model_dir, tmp_path, f"optim.micro_batch_tokens={tokens}"),
                                             model_dir, cpu, torch.float32, 20)
    _, bf16 = memory_plan.plan_memory(_cfg(model_dir, tmp_path, f"optim.micro_batch_tokens={tokens}",
                                           f"model.compute_dtype={compute}"), model_dir, cpu, torch.float32, 20)
    assert bf16.per_token == saved_bytes_per_token(config, torch.float32, compute=compute)
    if compute == "bfloat16":  # the emulation keeps float32 copies of its rounded operands: larger, not smaller
        assert bf16.per_token < fp32.per_token
    chunk = fp32_cfg.optim.logprob_chunk_tokens * config.vocab_size * 4 * 3
    slack = memory_plan.ACTIVATION_SLACK
    assert fp32.parts["activations"] == int(tokens * fp32.per_token * slack) + chunk
    copies = cast * parameter_counts(config).linear + cast * config.vocab_size * config.hidden_size
    head_grad = cast * config.vocab_size * config.hidden_size  # a chunk's (V, H) weight-gradient product
    assert bf16.parts["activations"] == int(tokens * bf16.per_token * slack) + chunk + copies + head_grad
    # generation samples in bf16 too (models/compute.py): the same weight copies, a bf16 KV cache
    assert bf16.parts["generation"] - fp32.parts["generation"] == copies - _kv_bytes(config, fp32_cfg, 20) // 2


def _kv_bytes(config, cfg, prompt_tokens: int) -> int:
    """The float32 KV cache of the larger of a step's and an evaluation's generation, by hand."""
    rows = max(cfg.rollout.prompts_per_step * cfg.rollout.group_size, min(cfg.eval.batch_size, cfg.eval.n))
    kv_heads, head_dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    return rows * (prompt_tokens + cfg.rollout.max_new_tokens) * config.num_hidden_layers * 2 * kv_heads * head_dim * 4
