"""Data-parallel training over processes and machines with torch.distributed (launched by torchrun).

    torchrun --nproc_per_node=N --no-python grpo train ...      DDP: gloo on CPUs, nccl on GPUs
    ... parallel.strategy=fsdp                                  FSDP2 (fully_shard per decoder layer)

The only package that calls torch.distributed. `dist.py`: the process group, collectives and the way a global
batch is split (see its docstring for why N processes compute the 1-process gradient); `wrap.py`: DDP/FSDP
wrapping, generation under FSDP, batch alignment, full-state checkpoints, rank-0-only I/O helpers.
See docs/scale.md for launch commands.
"""

from grpo.parallel.dist import (
    SINGLE,
    Dist,
    all_reduce_grads,
    all_reduce_sum,
    barrier,
    check_parallel_config,
    init_distributed,
    is_main,
    world_size,
)
from grpo.parallel.wrap import (
    NullWriter,
    SyncedGuard,
    align_batch,
    backward_sync,
    checkpoint_views,
    full_state_dict,
    generation,
    is_fsdp,
    shard_frozen,
    wrap_policy,
)

__all__ = ["SINGLE", "Dist", "NullWriter", "SyncedGuard", "align_batch", "all_reduce_grads", "all_reduce_sum", "backward_sync", "barrier",
           "check_parallel_config", "checkpoint_views", "full_state_dict", "generation", "init_distributed", "is_fsdp", "is_main", "shard_frozen",
           "world_size", "wrap_policy"]
