"""grpo.parallel in one process: every collective is the identity, the global batch is split the way the
data-parallel equivalence needs, seeds do not depend on the rank when keyed by the prompt, and settings that
cannot run over several processes are refused by name."""

from __future__ import annotations

import pytest
import torch

from grpo.config import load_config
from grpo.parallel import (
    SINGLE,
    Dist,
    NullWriter,
    SyncedGuard,
    align_batch,
    check_parallel_config,
    generation,
    init_distributed,
    is_main,
    world_size,
    wrap_policy,
)
from grpo.train.update import PolicyBatch


def test_one_process_is_the_identity(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    d = init_distributed(load_config(None).parallel)
    assert not d.enabled and d.is_main and is_main() and world_size() == 1
    assert d.shard([1, 2, 3]) == [1, 2, 3] and d.sum(2.5) == 2.5 and d.any(True) and not d.all(False)
    metrics = {"reward/mean": 0.5, "rollout/groups": 4.0}
    assert d.reduce_metrics(metrics) == metrics
    model = torch.nn.Linear(2, 2)
    assert wrap_policy(model, d) is model
    with generation(model, d):
        pass
    guard = type("G", (), {"requested": True, "signal_name": "SIGTERM"})()
    synced = SyncedGuard(guard, d)
    assert synced.requested and synced.signal_name == "SIGTERM"
    NullWriter().write({"step": 1})


def test_ranks_take_contiguous_slices_of_the_global_batch_and_strided_eval():
    items = list(range(8))
    parts = [Dist(rank=r, world_size=4).shard(items) for r in range(4)]
    assert parts == [[0, 1], [2, 3], [4, 5], [6, 7]] and [x for p in parts for x in p] == items  # rank order = 1-process order
    with pytest.raises(ValueError, match="do not split evenly"):
        Dist(rank=0, world_size=3).shard(items)
    strided = [Dist(rank=r, world_size=3).shard_strided(list(range(7))) for r in range(3)]
    assert Dist(world_size=3).unstride(strided) == list(range(7))


def test_generators_are_keyed_by_prompt_not_rank():
    a = Dist(rank=0, world_size=2).step_generator(0, 3, 0, "d.jsonl:5")
    b = Dist(rank=1, world_size=2).step_generator(0, 3, 0, "d.jsonl:5")
    assert torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=b))
    c = Dist(rank=0, world_size=2).step_generator(0, 3)
    d = Dist(rank=1, world_size=2).step_generator(0, 3)
    assert not torch.equal(torch.rand(4, generator=c), torch.rand(4, generator=d))  # per rank without a uid
    e = SINGLE.step_generator(0, 4, 0, "d.jsonl:5")
    assert not torch.equal(torch.rand(4, generator=SINGLE.step_generator(0, 3, 0, "d.jsonl:5")),
                           torch.rand(4, generator=e))  # and per step


@pytest.mark.parametrize("overrides,match", [
    (["rollout.prompts_per_step=3"], "rollout.prompts_per_step=3 does not divide"),
    (["algo.advantage=gae", "parallel.strategy=fsdp"], "critic is data-parallel"),
    (["parallel.strategy=fsdp", "model.save_merged=true"], "model.save_merged"),
])
def test_settings_that_cannot_run_on_several_processes_are_named(overrides, match):
    cfg = load_config(None, overrides)
    with pytest.raises(ValueError, match=match):
        check_parallel_config(cfg, Dist(world_size=2, strategy=cfg.parallel.strategy))
    check_parallel_config(cfg, SINGLE)  # one process: anything goes


def test_align_batch_is_a_no_op_in_one_process():
    batch = PolicyBatch(prompt_ids=torch.ones(1, 3, dtype=torch.long), prompt_mask=torch.ones(1, 3),
                        completion_ids=torch.ones(2, 4, dtype=torch.long), mask=torch.ones(2, 4),
                        adv=torch.zeros(2), group_size=2)
    assert align_batch(batch, SINGLE, 0).completion_ids.shape == (2, 4)
