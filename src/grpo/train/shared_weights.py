"""A policy's parameters in shared memory, for a rollout worker in another process (rollout.mode=async).

    trainer                                    worker
    weights = SharedWeights(policy)            (received as a Process argument: the same memory)
    weights.publish(policy, version)  ----->   weights.wait_for(version - K) ; weights.load_into(worker_policy)

One copy of every parameter lives in shared memory, with the version it holds (optimizer steps taken). `publish`
copies the trainable parameters in (the frozen ones never change: LoRA copies only its adapters) and `load_into`
copies all of them out, each under one lock, so the worker never samples from a half-written policy and the
trainer never waits longer than one copy.

Nothing here waits without looking up: the lock is taken in POLL_S slices, between which the caller's `gone()`
says whether the other side died (a lock held by a dead process is never released), and the worker waits for a
version by reading it every POLL_S, not on a condition variable (one whose waiter was killed blocks the next notify).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

POLL_S = 0.01


class SideGone(RuntimeError):
    """The other process died (or was asked to stop) while this one waited for the weights' lock."""


class SharedWeights:
    def __init__(self, model: torch.nn.Module, ctx):
        """model: the trainer's policy on the CPU (its named_parameters are the contract: the worker's model must have
        the same names and shapes); ctx: a multiprocessing context (spawn)."""
        params = dict(model.named_parameters())
        self.tensors = {name: p.detach().clone().share_memory_() for name, p in params.items()}
        self.trainable = [name for name, p in params.items() if p.requires_grad]
        self.version = ctx.Value("q", -1, lock=False)  # -1: nothing published yet
        self.lock = ctx.Lock()

    @torch.no_grad()
    def publish(self, model: torch.nn.Module, version: int, gone: Callable[[], bool],
                timeout_s: float | None = None) -> None:
        """Copy `model`'s trainable parameters in (all of them on the first call) and mark them `version`. Raises
        SideGone when gone() turns true, TimeoutError after timeout_s, while the lock is held by the other side."""
        params = dict(model.named_parameters())
        names = self.tensors if self.version.value < 0 else self.trainable
        self._acquire(gone, timeout_s)
        try:
            for name in names:
                self.tensors[name].copy_(params[name].detach())
            self.version.value = version
        finally:
            self.lock.release()

    @torch.no_grad()
    def load_into(self, model: torch.nn.Module, gone: Callable[[], bool]) -> int:
        """Copy every shared parameter into `model` (same names); returns the version loaded."""
        params = dict(model.named_parameters())
        missing = sorted(set(self.tensors) - set(params))
        if missing:
            raise RuntimeError(f"the rollout worker's model has no parameters named {missing[:5]}: it was not built "
                               "like the trainer's")
        self._acquire(gone, None)
        try:
            for name, tensor in self.tensors.items():
                params[name].copy_(tensor)
            return int(self.version.value)
        finally:
            self.lock.release()

    def wait_for(self, version: int, gone: Callable[[], bool]) -> bool:
        """Until the published version is at least `version`; False when gone() turned true first."""
        while self.version.value < version:
            if gone():
                return False
            time.sleep(POLL_S)
        return True

    def current(self) -> int:
        return int(self.version.value)

    def _acquire(self, gone: Callable[[], bool], timeout_s: float | None) -> None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.lock.acquire(True, 0.2):
            if gone():
                raise SideGone("the other side of the shared weights is gone")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the shared weights' lock was not released in {timeout_s:g} s")
