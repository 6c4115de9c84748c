"""grpo.tracking.memory: the resident-set peak that training metrics, the bench and compare report."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from grpo.tracking.memory import peak_rss_mb, reset_peak_rss


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")
def test_peak_follows_an_allocation_and_resets():
    reset_peak_rss()
    base = peak_rss_mb()
    block = np.ones(300 * 2**20 // 8)  # 300 MiB, every page touched
    grown = peak_rss_mb()
    del block
    reset_peak_rss()
    after = peak_rss_mb()
    assert grown - base > 250, (base, grown)
    assert grown - after > 250, "reset_peak_rss did not restart the mark after the block was freed"
