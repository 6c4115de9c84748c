"""A policy's parameters in shared memory, for a rollout worker in another process (rollout.mode=async).

    trainer                                    worker
    weights = SharedWeights(policy)            (received as a Process argument: the same memory)
    weights.publish(policy, version)  ----->   weights.wait_for(version - K) ; weights.load_into(worker_policy)

One copy of every parameter lives in shared memory, with the version it holds (optimizer steps taken). `publish`
copies the trainable parameters in (the frozen ones never change: LoRA copies only its adapters) and `load_into`
copies all of them out, each under one lock, so the worker never samples from a half-written policy and the
trainer never waits longer than one copy.
"""

from __future__ import annotations

import torch


class SharedWeights:
    def __init__(self, model: torch.nn.Module, ctx):
        """model: the trainer's policy (its named_parameters are the contract: the worker's model must have the same
        names and shapes); ctx: a multiprocessing context (spawn)."""
        params = dict(model.named_parameters())
        self.tensors = {name: p.detach().clone().share_memory_() for name, p in params.items()}
        self.trainable = [name for name, p in params.items() if p.requires_grad]
        self.version = ctx.Value("q", -1, lock=False)  # -1: nothing published yet
        self.changed = ctx.Condition()

    @torch.no_grad()
    def publish(self, model: torch.nn.Module, version: int, timeout_s: float | None = None) -> None:
        """Copy `model`'s trainable parameters in (all of them on the first call) and mark them `version`. The lock is
        waited for at most timeout_s (None: forever): a worker that died while copying out never releases it, and
        then TimeoutError."""
        params = dict(model.named_parameters())
        names = self.tensors if self.version.value < 0 else self.trainable
        if not self.changed.acquire(True, timeout_s):
            raise TimeoutError(f"the shared weights' lock was not released in {timeout_s:g} s")
        try:
            for name in names:
                self.tensors[name].copy_(params[name].detach())
            self.version.value = version
            self.changed.notify_all()
        finally:
            self.changed.release()

    @torch.no_grad()
    def load_into(self, model: torch.nn.Module) -> int:
        """Copy every shared parameter into `model` (same names); returns the version loaded."""
        params = dict(model.named_parameters())
        missing = sorted(set(self.tensors) - set(params))
        if missing:
            raise RuntimeError(f"the rollout worker's model has no parameters named {missing[:5]}: it was not built "
                               "like the trainer's")
        with self.changed:
            for name, tensor in self.tensors.items():
                params[name].copy_(tensor)
            return int(self.version.value)

    def wait_for(self, version: int, should_stop, poll_s: float = 0.2) -> bool:
        """Block until the published version is at least `version`; False when should_stop() turned true first."""
        with self.changed:
            while self.version.value < version:
                if should_stop():
                    return False
                self.changed.wait(poll_s)
        return True

    def current(self) -> int:
        return int(self.version.value)

