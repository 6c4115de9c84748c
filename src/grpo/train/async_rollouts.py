"""rollout.mode=async: a worker process samples and scores the next batches while the trainer updates.

    trainer (this process)                          worker (grpo.train.rollout_worker, spawned at the first step)
    step s: batch = queue.get()   <--------------   batch s+1, s+2 ... sampled with policy version >= s+1-K
            update with pi_old = the sampler's log-probs (the policy that sampled; Trainer._old_and_ref_logprobs)
            weights.publish(policy, s+1)  ------->  (shared memory, one copy: grpo.train.shared_weights)

K = rollout.max_staleness bounds how many optimizer steps the sampling policy may lag: the worker does not start
step s's batch before version s - K is published, so a batch is never older than K (a batch that were would be
dropped and counted in rollout/dropped_stale). K = 0 is the synchronous schedule with the sampling in another
process: the same updates, bitwise. Each batch carries the version it was sampled with (rollout/staleness) and
the prompt stream's state after it (a checkpoint resumes after the last batch trained on; the batches sampled
ahead are sampled again after a resume, with the resumed weights).

The trainer never waits on the worker without a bound: a worker that dies is noticed within a poll (0.2 s), one
that produces nothing for rollout.worker_timeout_s (after its start-up, at most STARTUP_S) is killed; both raise
RolloutWorkerError, which stops the run with a checkpoint (train/loop.py). An exception inside the worker is
raised here as it was (a RewardOutputError stays one). Under torchrun (parallel.strategy=ddp) every rank has its own worker, which samples the rank's shard of the
step's prompts with the rank's generators, and loads its trainer's weights (identical on every rank after DDP's
update) from that trainer's shared memory: no collective carries weights, and one collective a step makes the
ranks stop together when one rank's worker fails. The CPU threads are split: the worker takes
rollout.worker_threads (default half), the trainer the rest.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue as queue_module
import threading
import time

import torch

from grpo.config import ConfigError
from grpo.errors import RolloutWorkerError
from grpo.parallel.dist import PROCESS_GROUP_TIMEOUT_S
from grpo.train.rollout_source import ScoredBatch
from grpo.train.rollout_worker import WorkerFailure, WorkerSpec, worker_main
from grpo.train.shared_weights import SharedWeights, SideGone

log = logging.getLogger("grpo.train")
POLL_S = 0.2
WORKER_ENV = "GRPO_ROLLOUT_WORKER"  # set in the worker's environment: a Trainer built there is a script without a guard
STARTUP_S = 600.0  # the worker's imports and model load, before rollout.worker_timeout_s applies


class AsyncRollouts:
    """The trainer's side: `next(step)` returns the step's ScoredBatch from the worker, `sync_weights` publishes the
    policy after each optimizer step, `close` stops the worker. trainer: grpo.train.trainer.Trainer (its cfg, policy,
    prompts, task, reward specs and stream); model_dir: the directory the policy was loaded from."""

    def __init__(self, trainer, model_dir):
        cfg = trainer.cfg
        check_async_config(cfg, trainer.dist, trainer.device)
        self.trainer, self.cfg, self.K = trainer, cfg, cfg.rollout.max_staleness
        self.spec = worker_spec(trainer, model_dir)
        self.proc = None
        self.publish_error: RolloutWorkerError | None = None
        self.dropped = 0
        self.staleness = 0.0
        self.wait_s = 0.0
        self._threads = None

    def next(self, step: int) -> ScoredBatch:
        """The batch for `step`. Under torchrun every rank returns one or every rank raises: a rank whose worker
        failed alone would leave the others waiting in the update's collectives (see _agree)."""
        failure = None
        try:
            item = self._next(step)
        except Exception as e:  # noqa: BLE001 - shared with the other ranks, then raised
            item, failure = None, e
        if self.trainer.dist.enabled:
            self._agree(failure)
        if failure is not None:
            raise failure
        # only now (every rank has its batch): a checkpoint resumes after this batch
        self.trainer.stream.load_state_dict(item.stream_state)
        return item

    def _agree(self, failure: Exception | None) -> None:
        """torchrun: one collective a step (two when a rank failed). When one rank's worker failed, every rank
        raises at this step: a dead or hung worker (RolloutWorkerError) on every failing rank stops all of them with
        the checkpoint (train/loop.py: each rank reaches the save), any other error (a reward's, raised with its
        type on its rank) stops them without one, as that error does in rollout.mode=sync."""
        d = self.trainer.dist
        if not d.any(failure is not None):
            return
        mine = None if failure is None else (isinstance(failure, RolloutWorkerError),
                                             f"{type(failure).__name__}: {failure}")
        reports = d.gather(mine)  # per rank: None, or (its worker died or hung, the message)
        checkpoint = all(r[0] for r in reports if r is not None)
        if mine is not None:
            if mine[0] and not checkpoint:  # another rank's error stops the job without one: so does this rank
                raise RuntimeError(str(failure)) from failure
            return  # next() raises this rank's own error
        rank, (_, text) = next((i, r) for i, r in enumerate(reports) if r is not None)
        self.close()
        raise (RolloutWorkerError if checkpoint else RuntimeError)(f"rank {rank}'s rollout worker failed: {text}")

    def _next(self, step: int) -> ScoredBatch:
        if self.publish_error is not None:  # the last step's publish failed: its update and metrics are kept
            error, self.publish_error = self.publish_error, None
            raise error
        if self.proc is None:
            self._start(step)
        while True:
            t = time.perf_counter()
            item = self._get()
            self.wait_s = time.perf_counter() - t
            if step - item.policy_version > self.K:  # cannot happen with the worker's wait; counted if it does
                self.dropped += 1
                continue
            self.staleness = float(step - item.policy_version)
            return item

    def sync_weights(self, policy, version: int) -> None:
        """Publish the policy after an optimizer step (one copy; the worker loads it before its next batch). A worker
        that died or holds the lock past rollout.worker_timeout_s fails the NEXT step (this one's update is done, and
        its metrics are logged and checkpointed with it)."""
        if self.proc is None:
            return
        try:
            self.weights.publish(policy, version, gone=lambda: not self.proc.is_alive(),
                                 timeout_s=self.cfg.rollout.worker_timeout_s)
        except (SideGone, TimeoutError) as e:
            code = self.proc.exitcode
            self.close(kill=True)
            self.publish_error = RolloutWorkerError(
                f"the rollout worker {'exited (code %s)' % code if code is not None else 'hung'} while the trainer "
                f"published step {version}'s weights ({e})")

    def metrics(self) -> dict[str, float]:
        """rollout/staleness: optimizer steps between the policy that sampled this batch and the one it updates;
        rollout/dropped_stale: batches older than K dropped so far; perf/wait_s: seconds the trainer waited for it."""
        return {"rollout/staleness": self.staleness, "rollout/dropped_stale": float(self.dropped),
                "perf/wait_s": self.wait_s}

    def close(self, kill: bool = False) -> None:
        """Stop the worker (asked, then killed after 10 s; kill: at once) and give the trainer its threads back."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        self.stop.set()
        proc.join(timeout=0 if kill else 10)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
        self.reader.close()  # the reading thread sees EOF (the worker's end is gone) and ends
        if self._threads is not None:
            torch.set_num_threads(self._threads)

    # ------------------------------------------------------------------ the worker
    def _start(self, step: int) -> None:
        ctx = torch.multiprocessing.get_context("spawn")
        self.weights = SharedWeights(self.trainer.policy, ctx)
        self.weights.publish(self.trainer.policy, step, gone=lambda: False)
        # a one-way pipe read by a thread of this process: the worker never waits for the trainer to read, and a
        # worker that dies mid-message is an EOF here (this process holds no copy of the writing end)
        self.reader, writer = ctx.Pipe(duplex=False)
        self.inbox: queue_module.Queue = queue_module.Queue()
        self.stop, self.ready = ctx.Event(), ctx.Event()
        total = torch.get_num_threads()
        worker_threads = self.cfg.rollout.worker_threads or max(1, total // 2)
        proc = ctx.Process(target=worker_main, name="grpo-rollout-worker", daemon=True,
                           args=(self.spec, self.weights, writer, self.stop, self.ready, step,
                                 self.trainer.stream.state_dict(), worker_threads))
        os.environ[WORKER_ENV] = "1"  # the child's environment: see refuse_in_worker
        try:
            proc.start()
        finally:
            del os.environ[WORKER_ENV]
            writer.close()
        self.proc, self.started = proc, time.monotonic()
        threading.Thread(target=_read_messages, args=(self.reader, self.inbox), daemon=True,
                         name="grpo-rollout-reader").start()
        self._threads = total
        torch.set_num_threads(max(1, total - worker_threads))
        log.info("rollout worker %d started at step %d (max_staleness=%d, %d threads; the trainer keeps %d)",
                 proc.pid, step, self.K, worker_threads, torch.get_num_threads())

    def _get(self) -> ScoredBatch:
        """The next item of the queue, waiting at most rollout.worker_timeout_s; a failure in the worker is raised."""
        timeout = self.cfg.rollout.worker_timeout_s
        deadline, start_limit, dead_since = time.monotonic() + timeout, self.started + STARTUP_S, None
        while True:
            try:
                message = self.inbox.get(timeout=POLL_S)
            except queue_module.Empty:
                message = None
            if isinstance(message, bytes):
                item = pickle.loads(message)
                break
            if isinstance(message, BaseException):  # EOF or a broken pipe: the worker is gone, maybe mid-message
                self.close(kill=True)
                raise RolloutWorkerError(f"the rollout worker's pipe closed ({message!r}) without a batch: killed (by "
                                         "the system, out of memory?) or crashed (its traceback, if any, is above)")
            if not self.ready.is_set() and time.monotonic() < start_limit:  # still importing and loading the model
                deadline = time.monotonic() + timeout
            if self.proc.is_alive():
                dead_since = None
            elif dead_since is None:  # its last message may still be on the way to the reading thread
                dead_since = time.monotonic()
            elif time.monotonic() - dead_since > 2.0 and self.inbox.empty():  # (a child of the worker holding the
                code = self.proc.exitcode                                      # pipe open: no EOF comes)
                self.close()
                raise RolloutWorkerError(f"the rollout worker exited (code {code}) without a batch: killed (by the "
                                         "system, out of memory?) or crashed (its traceback is above; a script that "
                                         "trains at import needs `if __name__ == '__main__':`, the worker is "
                                         "spawned and imports the main module)")
            if time.monotonic() > deadline:
                self.close(kill=True)  # hung: asking it to stop would wait for nothing
                raise RolloutWorkerError(f"the rollout worker produced no batch in rollout.worker_timeout_s="
                                         f"{self.cfg.rollout.worker_timeout_s:g} s; it was stopped. Raise the limit "
                                         "for slow generation or rewards")
        if isinstance(item, WorkerFailure):
            self.close()
            if isinstance(item.error, Exception):  # (a SystemExit or KeyboardInterrupt in the worker is its failure)
                log.debug("rollout worker traceback:\n%s", item.text)
                raise item.error
            raise RolloutWorkerError(f"the rollout worker failed:\n{item.text}")
        return item


def check_async_config(cfg, dist, device) -> None:
    """What rollout.mode=async cannot do yet, refused with the reason."""
    if cfg.rollout.engine != "native":
        raise ConfigError("rollout.mode=async runs the native sampler in a worker process; rollout.engine=vllm is "
                          "not supported there yet (use rollout.mode=sync with vLLM)")
    if dist.enabled and dist.strategy == "fsdp":
        raise ConfigError("rollout.mode=async under torchrun runs with parallel.strategy=ddp: each rank's worker "
                          "loads the whole weights after every update, and FSDP holds a shard per rank")
    if dist.enabled and STARTUP_S + cfg.rollout.worker_timeout_s >= PROCESS_GROUP_TIMEOUT_S:
        raise ConfigError(f"rollout.worker_timeout_s={cfg.rollout.worker_timeout_s:g} under torchrun: the other ranks "
                          f"wait for a rank's worker in a collective, which times out after "
                          f"{PROCESS_GROUP_TIMEOUT_S:g} s without a checkpoint; at most "
                          f"{PROCESS_GROUP_TIMEOUT_S - STARTUP_S - 1:g} (its start-up may take {STARTUP_S:g} more)")
    if dist.enabled and cfg.algo.drop_zero_std_groups:
        raise ConfigError("algo.drop_zero_std_groups (DAPO's resampling) with rollout.mode=async is one process "
                          "only: under torchrun the ranks decide together when to stop resampling, and the workers "
                          "are not in the job's process group; use rollout.mode=sync")
    if torch.device(device).type != "cpu":
        raise ConfigError(f"rollout.mode=async runs on the CPU only for now (the model is on {device}): the "
                          "shared-memory weight copy has not been run on a GPU; use rollout.mode=sync there")


def refuse_in_worker() -> None:
    """A Trainer built inside the rollout worker: the worker is spawned and imports the main module, so a script
    that trains at import would train again in it (over the same run directory). Refuse before anything happens."""
    if os.environ.get(WORKER_ENV):
        raise RuntimeError("a grpo Trainer was built inside the rollout worker of rollout.mode=async: the worker is a "
                           "spawned process that imports your script, so put the training under "
                           "`if __name__ == '__main__':`")


def worker_spec(trainer, model_dir) -> WorkerSpec:
    """What the worker needs, checked to pickle now (a clear error before any work, not a failure in the worker).
    Reward functions read from a file (reward.functions=[file.py:fn]) do not pickle: the worker reads them again."""
    cfg = trainer.cfg
    specs = trainer.reward_specs
    if not _pickles(specs):
        if cfg.reward.functions is None:
            names = [s[0] for s in specs if not _pickles(s)]
            raise ConfigError(f"rollout.mode=async sends the reward functions to the rollout worker and {names} "
                              "cannot be pickled (a lambda or a local function?): define them at module level, "
                              "or use rollout.mode=sync")
        specs = None  # rebuilt from cfg.reward.functions in the worker
    env_task = trainer.task if trainer.env_factory is not None else None
    if env_task is not None and not _pickles(env_task):
        raise ConfigError(f"rollout.mode=async sends the task to the rollout worker and {type(env_task).__name__} "
                          "cannot be pickled; use rollout.mode=sync")
    return WorkerSpec(cfg=cfg, model_dir=model_dir, train_prompts=trainer.train_prompts, env_task=env_task,
                      reward_specs=specs, rank=trainer.dist.rank, world_size=trainer.dist.world_size)


def _pickles(obj) -> bool:
    try:
        pickle.dumps(obj)
        return True
    except Exception:  # noqa: BLE001 - any reason it does not pickle
        return False


def _read_messages(reader, inbox: queue_module.Queue) -> None:
    """The reading thread: every message of the worker's pipe into `inbox` as bytes, then the exception that ended
    it (EOFError when the worker is gone, OSError when the trainer closed its end)."""
    while True:
        try:
            inbox.put(reader.recv_bytes())
        except (EOFError, OSError) as e:
            inbox.put(e)
            return
