"""rollout.stop reaches every place that samples: the trainer's engine (and so the async worker, which builds its own
with the same build_engine), a training step (finished rows, the reward's text cut, truncated_frac), the run's
evaluation, and `grpo eval` (greedy and sampled completions)."""

from __future__ import annotations

import json

import torch

from grpo.config import load_config
from grpo.rollout.factory import build_engine
from grpo.rollout.stop import cut_at_stop


def _common_char(texts: list[str]) -> str:
    """A letter or digit that occurs in many of the texts (not the first character: the cut must leave text)."""
    counts = {}
    for t in texts:
        for c in set(t[1:]):
            if c.isalnum():
                counts[c] = counts.get(c, 0) + 1
    return max(counts, key=counts.get)


def test_build_engine_passes_rollout_stop(tiny_model_dir):
    from grpo.models.loading import load_causal_lm, load_tokenizer

    cfg = load_config(None, ['rollout.stop=["\\n", "Question:"]'])
    engine = build_engine(cfg, load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir), tiny_model_dir)
    assert engine.stop == ("\n", "Question:")


def test_a_training_step_and_the_runs_evaluation_stop_at_rollout_stop(make_trainer):
    free = make_trainer("rollout.max_new_tokens=16", "rollout.group_size=4", run_dir=None)
    texts, greedy = free.step().rollouts.texts, free.evaluate()["completions"]
    assert any("\n" in c for c in greedy)  # the tiny model's greedy rows are newlines
    stops = ("\n", _common_char(texts))
    trainer = make_trainer("rollout.max_new_tokens=16", "rollout.group_size=4", f'rollout.stop=["\\n", "{stops[1]}"]')
    assert trainer.sampler.stop == stops
    result = trainer.step()
    r = result.rollouts
    assert not any(s in t for s in stops for t in r.texts)
    lengths = r.completion_mask.sum(-1)
    ended = torch.tensor([any(s in trainer.tokenizer.decode(r.completion_ids[i, :n]) for s in stops)
                          for i, n in enumerate(lengths)])
    assert ended.any() and not bool(r.truncated[ended].any())  # stopped rows are finished, not truncated
    assert result.metrics["rollout/truncated_frac"] == float(r.truncated.float().mean())
    evaluation = trainer.evaluate()
    assert not any(s in c for s in stops for c in evaluation["completions"])


def test_grpo_eval_stops_at_rollout_stop(tiny_model_dir, tmp_path, capsys):
    from grpo.cli import main

    def run(*extra):
        out = tmp_path / f"rows{len(extra)}.jsonl"
        assert main(["eval", str(tiny_model_dir), "rollout.max_new_tokens=12", *extra, "--task", "arithmetic",
                     "--n", "6", "--k", "2", "--output", str(out), "--json"]) == 0
        capsys.readouterr()
        return [json.loads(line) for line in out.read_text().splitlines()]

    free = run()
    samples = [c for r in free for c in r["samples"]]
    stops = ["\n", _common_char(samples)]  # the greedy rows are newlines here, the sampled ones characters
    rows = run(f'rollout.stop=["\\n", "{stops[1]}"]')
    assert any(s in c for s in stops for c in samples) and any("\n" in r["greedy"] for r in free)
    assert not any(s in r["greedy"] or any(s in c for c in r["samples"]) for s in stops for r in rows)
    for a, b in zip(free, rows):  # greedy: the same completion, cut before its first stop string
        assert b["greedy"] == cut_at_stop(a["greedy"], stops)
