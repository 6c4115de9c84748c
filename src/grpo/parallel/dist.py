"""The process group and the collectives the trainer needs; the only module (with wrap.py) that calls torch.distributed.

Data parallelism, the way a 1-process run defines the result:

    all ranks advance the same PromptStream by the global P and keep their slice of P / world_size prompts
    each rank samples its prompts' whole groups (G completions), so group normalisation is local and exact
    the loss of each micro-batch is aggregated with the GLOBAL token / sequence counts (all-reduced), and is
    multiplied by world_size, which cancels DDP's gradient averaging: the summed gradient is the 1-process one
    metrics are reduced over the ranks (mean; sums and maxima where named); only rank 0 writes files

`Dist` is the handle; with one process (no torchrun) every method is the identity and nothing is initialised.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch

log = logging.getLogger("grpo.parallel")

SUM_KEYS = ("rollout/groups", "perf/gen_tokens_per_s")  # totals over the ranks
MAX_PREFIXES = ("rollout/len_max", "perf/peak_rss_mb", "perf/step_s")  # the slowest / largest rank


def _dist():
    import torch.distributed as dist

    return dist


def _active() -> bool:
    return torch.distributed.is_available() and _dist().is_initialized()


def is_main() -> bool:
    """True on rank 0, or without a process group: the process that writes files and prints."""
    return not _active() or _dist().get_rank() == 0


def world_size() -> int:
    return _dist().get_world_size() if _active() else 1


def barrier() -> None:
    if _active():
        _dist().barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The element-wise sum over the ranks (in place, and returned); the identity with one process."""
    if _active():
        _dist().all_reduce(tensor, op=_dist().ReduceOp.SUM)
    return tensor


def all_reduce_grads(params) -> None:
    """Sum the gradients of `params` over the ranks, in place, in one collective (a flat buffer); the identity with
    one process. For a model that is not wrapped in DDP/FSDP (the PPO critic), whose loss each rank has already
    scaled by the job's token count."""
    if not _active():
        return
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    _dist().all_reduce(flat, op=_dist().ReduceOp.SUM)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


PROCESS_GROUP_TIMEOUT_S = 1800.0  # a collective waits this long for the other ranks, then fails


@dataclass
class Dist:
    """This process's place in the job: rank, world size, local rank (its GPU), backend and strategy."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    strategy: str = "ddp"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ collectives (identity with one process)
    def reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """Element-wise sum or max of a list of numbers over the ranks (float64, one collective)."""
        if not self.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        _dist().all_reduce(t, op={"sum": _dist().ReduceOp.SUM, "max": _dist().ReduceOp.MAX}[op])
        return t.tolist()

    def sum(self, value: float) -> float:
        return self.reduce([float(value)], "sum")[0]

    def max(self, value: float) -> float:
        return self.reduce([float(value)], "max")[0]

    def any(self, flag: bool) -> bool:
        return self.reduce([float(bool(flag))], "max")[0] > 0

    def all(self, flag: bool) -> bool:
        return not self.any(not flag)

    def gather(self, obj) -> list:
        """[obj of rank 0, obj of rank 1, ...] on every rank (small picklable objects)."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world_size
        _dist().all_gather_object(out, obj)
        return out

    def gather_cat(self, t: torch.Tensor) -> torch.Tensor:
        """The ranks' tensors concatenated along dim 0, in rank order (sizes may differ)."""
        if not self.enabled:
            return t
        return torch.cat([x.to(t.device) for x in self.gather(t.detach().cpu())])

    def barrier(self) -> None:
        if self.enabled:
            _dist().barrier()

    # ------------------------------------------------------------------ data
    def shard(self, items: list) -> list:
        """This rank's contiguous slice of a global batch (its length must divide by the world size)."""
        if not self.enabled:
            return items
        if len(items) % self.world_size:
            raise ValueError(f"{len(items)} items do not split evenly over {self.world_size} ranks")
        k = len(items) // self.world_size
        return items[self.rank * k:(self.rank + 1) * k]

    def shard_strided(self, items: list) -> list:
        """Items rank, rank + W, rank + 2W, ... (any length; for evaluation)."""
        return items[self.rank::self.world_size] if self.enabled else items

    def unstride(self, parts: list[list]) -> list:
        """Inverse of shard_strided over the gathered parts: the original order."""
        out = []
        for i in range(max((len(p) for p in parts), default=0)):
            out += [p[i] for p in parts if i < len(p)]
        return out

    def reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Per-rank step metrics -> job metrics: mean over the ranks, except SUM_KEYS (summed) and
        MAX_PREFIXES (maximum). Values already global (identical on every rank) stay as they are."""
        if not self.enabled:
            return metrics
        parts = self.gather(metrics)
        out = {}
        for key in metrics:
            vals = [float(p[key]) for p in parts if key in p]
            if key in SUM_KEYS:
                out[key] = sum(vals)
            elif key.startswith(MAX_PREFIXES):
                out[key] = max(vals)
            else:
                out[key] = vals[0] if all(v == vals[0] for v in vals) else sum(vals) / len(vals)
        return out

    # ------------------------------------------------------------------ randomness
    def step_generator(self, seed: int, step: int, round_: int = 0, uid: str | None = None,
                       device: torch.device | None = None) -> torch.Generator:
        """A generator for one generation call, seeded by (seed, step, round, uid) or, without a uid, by
        (seed, step, round, rank): reproducible, needs no saved state, so a resume samples what a straight run
        would have sampled."""
        key = f"{seed}-{step}-{round_}-" + (f"uid:{uid}" if uid is not None else f"rank:{self.rank}")
        g = torch.Generator(device=device or self.device)
        g.manual_seed(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") & (2**63 - 1))
        return g

    def close(self) -> None:
        if self.enabled and _active():
            _dist().destroy_process_group()


SINGLE = Dist()


def check_parallel_config(cfg, d: Dist) -> None:
    """Settings that cannot run over several processes: a ValueError naming the setting."""
    if not d.enabled:
        return
    P = cfg.rollout.prompts_per_step
    if P % d.world_size:
        raise ValueError(f"rollout.prompts_per_step={P} does not divide by the {d.world_size} processes: each "
                         "rank samples the whole groups of P / world_size prompts")
    if cfg.algo.advantage == "gae" and d.strategy == "fsdp":
        raise ValueError("algo.advantage=gae (PPO with a critic) runs with parallel.strategy=ddp: the critic is "
                         "data-parallel (a whole copy on every rank), not sharded")
    if d.strategy == "fsdp" and cfg.model.save_merged:
        raise ValueError("model.save_merged=true is not supported with parallel.strategy=fsdp; save the adapter "
                         "and merge it afterwards (peft merge_and_unload)")


def init_distributed(parallel_cfg, device: str = "auto") -> Dist:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the
    environment); a single process without them. gloo on the CPU, nccl on CUDA (parallel.backend=auto); each
    rank uses the GPU of its LOCAL_RANK."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(strategy=parallel_cfg.strategy)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    on_cuda = torch.cuda.is_available() and not device.startswith("cpu")
    backend = parallel_cfg.backend if parallel_cfg.backend != "auto" else ("nccl" if on_cuda else "gloo")
    if backend == "nccl" and not on_cuda:
        raise ValueError("parallel.backend=nccl needs CUDA devices; use gloo (or auto) on the CPU")
    dev = torch.device("cpu")
    if on_cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    dist = _dist()
    if not dist.is_initialized():
        kwargs = {"device_id": dev} if backend == "nccl" else {}
        dist.init_process_group(backend, timeout=timedelta(seconds=PROCESS_GROUP_TIMEOUT_S), **kwargs)
    if dist.get_world_size() != world or dist.get_rank() != rank:
        raise RuntimeError(f"process group is rank {dist.get_rank()} of {dist.get_world_size()}, the environment "
                           f"says {rank} of {world}")
    log.info("rank %d of %d (local %d): %s, %s", rank, world, local_rank, backend, parallel_cfg.strategy)
    return Dist(rank=rank, world_size=world, local_rank=local_rank, backend=backend,
                strategy=parallel_cfg.strategy, device=dev)
