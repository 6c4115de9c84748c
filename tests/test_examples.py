"""examples/grpo_minimal.py against the library: the same batch gives the same update.

The single-file example is the map a newcomer reads; the library must be the same algorithm. Here the library's
Trainer runs one real step whose sampler is replaced by the example's `sample` (so both see one batch), and the
example then runs its own `update` on that batch from the same starting weights. Gradients and parameters must
agree. A library that dropped the 1/|o_i| normalisation, the std division, the KL term or the temperature, or
the example drifting from the library, fails here.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch
from helpers.precision import FLOAT32

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "grpo_minimal.py"
P, G, T = 3, 4, 8
LR = 0.01  # the one AdamW step both sides take


def _load_example():
    spec = importlib.util.spec_from_file_location("grpo_minimal", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _reward(prompts, completions, **columns):
    """Varied and deterministic, so every group has a spread (non-zero advantages)."""
    return [(sum(map(ord, c)) % 7) / 6 for c in completions]


_reward.in_process = True


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from grpo.models.builtin import build_model, build_tokenizer

    tok = build_tokenizer()
    size = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=2, max_position_embeddings=128)
    path = tmp_path_factory.mktemp("tiny")
    build_model(tok, seed=3, size=size).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _one_step(model_dir, tmp_path, *extra, perturb: bool = False):
    """(library policy after one Trainer.step, example model after one update, the starting policy).
    perturb: move the policy away from the (frozen, loaded) reference first, so a KL term has a gradient."""
    from grpo.config import load_config
    from grpo.train.trainer import Trainer
    from grpo.types import Rollouts

    ex = _load_example()
    cfg = load_config(None, [f"model.name={model_dir}", f"train.output_dir={tmp_path}", "train.steps=1",
                             f"rollout.prompts_per_step={P}", f"rollout.group_size={G}",
                             f"rollout.max_new_tokens={T}", f"optim.lr={LR}", "optim.warmup_steps=0",
                             "optim.schedule=constant", "data.train_size=20", "eval.n=4",
                             *FLOAT32, *extra])  # the example computes in float32 (helpers/precision.py)
    torch.manual_seed(0)
    trainer = Trainer(cfg, reward_functions=[("r", _reward, 1.0)])
    ref_model = copy.deepcopy(trainer.policy).requires_grad_(False)  # what the library's reference holds
    if perturb:
        with torch.no_grad():
            for p in trainer.policy.parameters():
                p.add_(0.05 * torch.randn_like(p))
    start = copy.deepcopy(trainer.policy)
    example_model = copy.deepcopy(trainer.policy)  # the same starting weights
    tok = trainer.tokenizer
    seen = {}

    def example_sampler(prompts, group_size, generator=None, temperature=None):  # the engine contract (rollout/engine.py)
        prompt_ids, prompt_mask, completion_ids, _ = ex.sample(example_model, tok, [p.text for p in prompts],
                                                               group_size, T, cfg.rollout.temperature)
        # A random tiny model rarely samples EOS within T tokens; end the completions at varied lengths (and leave
        # some cut off) so that the 1/|o_i| normalisation is tested: a loss that divides by T fails then.
        for i in range(completion_ids.shape[0]):
            if i % 3:
                completion_ids[i, i % (T - 1)] = tok.eos_token_id
                completion_ids[i, i % (T - 1) + 1:] = tok.pad_token_id
        mask = ex.completion_mask(completion_ids, tok.eos_token_id)
        batch = prompt_ids, prompt_mask, completion_ids, mask
        truncated = (mask.sum(1) == T) & (completion_ids[:, -1] != tok.eos_token_id)
        with torch.no_grad():
            logp = ex.token_logprobs(example_model, *batch, cfg.rollout.temperature) * mask
        texts = tok.batch_decode(completion_ids, skip_special_tokens=True)
        seen["batch"], seen["texts"] = batch, texts
        return Rollouts(prompts=list(prompts), group_size=group_size, prompt_ids=prompt_ids,
                        prompt_mask=prompt_mask, completion_ids=completion_ids, completion_mask=mask.long(),
                        logp=logp, truncated=truncated, texts=texts)

    trainer.sampler.generate = example_sampler
    grads = {}  # the library's gradient as its optimizer is about to apply it (the update frees it afterwards)
    trainer.optimizer.register_step_pre_hook(lambda *_: grads.update(
        {n: p.grad.clone() for n, p in trainer.policy.named_parameters() if p.grad is not None}))
    trainer.step()
    trainer.close()

    rewards = torch.tensor(_reward(None, seen["texts"]))
    assert rewards.view(P, G).std(1).min() > 0, "the test needs a reward spread in every group"
    adv = ex.group_advantages(rewards.view(P, G)).view(-1)
    opt = torch.optim.AdamW(example_model.parameters(), lr=LR, betas=(0.9, 0.99), weight_decay=0.0)
    ex.update(example_model, opt, seen["batch"], adv, temperature=cfg.rollout.temperature,
              clip_eps=cfg.algo.clip_low, beta=cfg.kl.coef, ref_model=ref_model,
              max_grad_norm=cfg.optim.max_grad_norm)
    return (trainer.policy, grads), example_model, start


def _assert_same_update(library, example, start):
    library, grads = library
    moved = 0
    for (name, a), b, s in zip(library.named_parameters(), example.parameters(), start.parameters()):
        torch.testing.assert_close(grads.get(name), b.grad, rtol=1e-4, atol=1e-7, msg=lambda m: f"{name} gradient: {m}")
        # AdamW's first step is lr * g / (|g| + eps) (eps = 1e-8): written here from the library's own gradient, it
        # checks the step exactly (learning rate, weight decay, bias correction); a wrong step is off by about lr.
        g = grads[name]
        torch.testing.assert_close(a, s - LR * g / (g.abs() + 1e-8), rtol=0, atol=1e-6, msg=lambda m: f"{name}: {m}")
        # against the example's weights only where |g| >> eps: at |g| ~ eps a rounding of g (1e-7 allowed above)
        # moves the step by up to lr (CPUs whose vector width differs round g differently there)
        sure = g.abs() > 1e-5
        torch.testing.assert_close(a[sure], b[sure], rtol=0, atol=1e-5, msg=lambda m: f"{name}: {m}")
        moved += int((a - s).abs().max() > 1e-3)
    assert moved > 0, "the step changed no parameter: nothing was compared"


@pytest.mark.parametrize("extra", [[], ["rollout.temperature=0.7"]], ids=["default", "temperature"])
def test_example_step_equals_library_step(model_dir, tmp_path, extra):
    library, example, start = _one_step(model_dir, tmp_path, *extra)
    _assert_same_update(library, example, start)


def test_example_step_equals_library_step_with_kl(model_dir, tmp_path):
    """beta > 0 with the policy moved away from its reference (at pi = pi_ref the k3 term has no gradient, so a
    dropped KL term would pass unseen). A large beta makes the KL part of the gradient dominate."""
    library, example, start = _one_step(model_dir, tmp_path, "kl.coef=1.0", "kl.estimator=k3", perturb=True)
    _assert_same_update(library, example, start)


def test_example_advantages_follow_formula_4_1():
    """Hand vector: rewards [10, 0, 10, 7] have mean 6.75 and population std 4.0850 (1/G, formula 4.1)."""
    ex = _load_example()
    adv = ex.group_advantages(torch.tensor([[10.0, 0.0, 10.0, 7.0], [1.0, 1.0, 1.0, 1.0]]))
    std = (((10 - 6.75) ** 2 * 2 + 6.75 ** 2 + 0.25 ** 2) / 4) ** 0.5
    expected = torch.tensor([[3.25, -6.75, 3.25, 0.25]]) / (std + 1e-6)
    torch.testing.assert_close(adv[0], expected[0])
    assert torch.equal(adv[1], torch.zeros(4))


def test_example_completion_mask_stops_after_first_eos():
    ex = _load_example()
    ids = torch.tensor([[5, 1, 9, 1], [5, 6, 7, 8], [1, 0, 0, 0]])
    assert ex.completion_mask(ids, eos_id=1).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


def test_example_reads_problem_files_and_logs_its_curve(model_dir, tmp_path, monkeypatch):
    """--train/--test/--log (the learning benchmark runs the example on the library's data files): the rows
    written are one per evaluation, with completions = step * P * G and time that starts at 0 and only grows."""
    import json
    import sys

    ex = _load_example()
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"What is {a} + 1?\n", "answer": str(a + 1)}) + "\n"
                             for a in range(10)))
    test.write_text(json.dumps({"prompt": "What is 2 + 2?\n", "answer": 4}) + "\n"
                    + json.dumps({"prompt": "What is 5 - 3?\n", "answer": "2"}) + "\n")
    assert ex.read_problems(str(test)) == [("What is 2 + 2?\n", 4), ("What is 5 - 3?\n", 2)]
    assert ex.read_problems(str(train), 3) == [(f"What is {a} + 1?\n", a + 1) for a in range(3)]
    log = tmp_path / "curve.jsonl"
    monkeypatch.setattr(sys, "argv", ["grpo_minimal.py", "--model", str(model_dir), "--train", str(train),
                                      "--test", str(test), "--steps", "3", "--prompts", "2", "--group", "2",
                                      "--max-new-tokens", "4", "--eval-every", "2", "--log", str(log)])
    ex.main()
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2, 3]
    assert [r["completions"] for r in rows] == [0, 8, 12]
    assert all(r["accuracy"] in (0.0, 0.5, 1.0) for r in rows)
    assert rows[0]["train_s"] == rows[0]["train_cpu_s"] == 0.0
    assert 0 < rows[1]["train_s"] <= rows[2]["train_s"] and 0 < rows[1]["train_cpu_s"] <= rows[2]["train_cpu_s"]
