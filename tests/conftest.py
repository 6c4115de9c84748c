"""Shared fixtures: a private GRPO_CACHE for every test, and a leak check for sandboxed and forked processes (used by
the reward and code-task tests). Helpers shared between folders live in tests/helpers/."""

from __future__ import annotations

import time

import psutil
import pytest

SANDBOX_UID_RANGE = range(0x70000000, 0x70000000 + (1 << 24))
BOOT_MARK = "grpo-sandbox: program started"


def _sandbox_pids() -> set[int]:
    """Processes that belong to a sandbox: its unprivileged uid, or the sandbox's bootstrap on the command line."""
    found = set()
    for p in psutil.process_iter(["pid", "uids", "cmdline"]):
        try:
            uids = p.info["uids"]
            cmd = " ".join(p.info["cmdline"] or [])
        except (psutil.Error, TypeError):
            continue
        if (uids and uids.real in SANDBOX_UID_RANGE) or BOOT_MARK in cmd:
            found.add(p.info["pid"])
    return found


def _judge_process(p: psutil.Process) -> bool:
    """The judge's own process (grpo.sandbox.budget): one long-lived worker by design, not a leak."""
    try:
        return "grpo.sandbox.budget import _worker_main" in " ".join(p.cmdline())
    except psutil.Error:
        return True  # gone


def leftovers(before: set[int], marker: str | None = None, *, wait_s: float = 2.0) -> list[str]:
    """Describe processes started since `before` that are still there after up to `wait_s` seconds (zombies too)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        me = psutil.Process()
        for p in psutil.process_iter(["pid", "cmdline", "status", "ppid"]):
            try:
                cmd = " ".join(p.info["cmdline"] or [])
            except TypeError:
                cmd = ""
            if p.info["pid"] in before:
                continue
            if marker and marker in cmd:
                left.append(f"{p.info['pid']} {p.info['status']} {cmd[:80]}")
        left += [f"{p} sandbox" for p in _sandbox_pids() - before]
        left += [f"{c.pid} child {c.status()}" for c in me.children(recursive=True)
                 if c.pid not in before and not _judge_process(c)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.fixture
def no_leak():
    """Yields a checker; at the end asserts no sandbox/child process started during the test survives."""
    before = _sandbox_pids() | {c.pid for c in psutil.Process().children(recursive=True)}
    markers: list[str] = []
    yield markers
    left = leftovers(before, markers[0] if markers else None)
    assert not left, f"processes left behind: {left}"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Nothing a test does may touch the user's ~/.cache/grpo: GRPO_CACHE is tmp_path/grpo-cache."""
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path / "grpo-cache"))
