"""train.memory_limit (train/memory_limit.py): auto is what this process can have at start less a margin, a cgroup's
limit below the machine's free memory wins, a number is kept to what the machine has, and bad values are refused
naming the field; at the end of a run a measured peak over the limit is said."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo.config import load_config
from grpo.errors import ConfigError
from grpo.train import memory_limit as ml

GIB = 2**30


def _tree(root: Path, rel: str, files: dict[str, str]) -> None:
    d = root / rel.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)


def test_cgroup_v2_room_is_the_limit_less_the_usage_less_the_reclaimable_page_cache(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/user.slice/job\n")
    _tree(tmp_path / "fs", "/user.slice/job", {"memory.max": f"{8 * GIB}\n", "memory.current": f"{3 * GIB}\n",
                                               "memory.stat": f"anon 100\ninactive_file {GIB}\nactive_file 7\n"})
    _tree(tmp_path / "fs", "/user.slice", {"memory.max": "max\n", "memory.current": "5\n"})  # no limit above
    assert ml.cgroup_room(proc, tmp_path / "fs") == 8 * GIB - 3 * GIB + GIB
    _tree(tmp_path / "fs", "/user.slice", {"memory.max": f"{5 * GIB}\n", "memory.current": f"{4 * GIB}\n"})
    assert ml.cgroup_room(proc, tmp_path / "fs") == GIB  # an ancestor's tighter limit wins


def test_cgroup_v1_room_and_no_limit(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/process_api/abc\n3:cpuset:/\n")
    _tree(tmp_path / "fs", "/memory/process_api/abc", {"memory.limit_in_bytes": f"{6 * GIB}\n",
                                                       "memory.usage_in_bytes": f"{2 * GIB}\n",
                                                       "memory.stat": "total_inactive_file 0\n"})
    _tree(tmp_path / "fs", "/memory", {"memory.limit_in_bytes": "9223372036854771712\n",  # v1's "no limit"
                                       "memory.usage_in_bytes": "1\n"})
    assert ml.cgroup_room(proc, tmp_path / "fs") == 4 * GIB
    proc.write_text("4:memory:/\n")
    assert ml.cgroup_room(proc, tmp_path / "fs") is None
    assert ml.cgroup_room(tmp_path / "missing", tmp_path / "fs") is None


def test_a_cgroup_limit_below_the_free_memory_is_what_the_process_can_have(monkeypatch):
    from grpo.train import budget

    monkeypatch.setattr(budget, "machine_memory", lambda device: (64 * GIB, 40 * GIB))
    monkeypatch.setattr(ml, "process_rss", lambda: GIB)
    monkeypatch.setattr(ml, "cgroup_room", lambda: 5 * GIB)
    assert ml.available_memory(torch.device("cpu")) == (6 * GIB, "memory")
    monkeypatch.setattr(ml, "cgroup_room", lambda: None)
    assert ml.available_memory(torch.device("cpu")) == (41 * GIB, "memory")


def _cfg(*overrides: str):
    return load_config(None, list(overrides))


def test_auto_keeps_a_margin_and_a_number_is_kept_to_the_machine(monkeypatch):
    monkeypatch.setattr(ml, "available_memory", lambda device: (20 * GIB, "memory"))
    cpu = torch.device("cpu")
    auto = ml.memory_limit(_cfg(), cpu)
    assert auto.bytes == 18 * GIB and "20.0 GiB available less a 2.0 GiB margin" in auto.how
    monkeypatch.setattr(ml, "available_memory", lambda device: (4 * GIB, "memory"))
    assert ml.memory_limit(_cfg(), cpu).bytes == 3 * GIB  # the margin is at least 1 GiB
    asked = ml.memory_limit(_cfg("train.memory_limit=2.5"), cpu)
    assert asked.bytes == int(2.5 * GIB) and asked.how == "train.memory_limit=2.5 GiB"
    more = ml.memory_limit(_cfg("train.memory_limit=100"), cpu)  # larger than the machine: what it has
    assert more.bytes == 4 * GIB and "more than the 4.0 GiB this machine has available" in more.how
    monkeypatch.setattr(ml, "available_memory", lambda device: (None, "memory"))
    assert ml.memory_limit(_cfg(), cpu).bytes is None
    assert ml.memory_limit(_cfg("train.memory_limit=3"), cpu).bytes == 3 * GIB


@pytest.mark.parametrize("value", ["0", "-1", "lots", "inf", "nan", "true", "[1]"])
def test_a_limit_that_cannot_be_meant_is_refused_naming_the_field(value):
    with pytest.raises(ConfigError, match="train.memory_limit"):
        _cfg(f"train.memory_limit={value}")
    assert _cfg("train.memory_limit=AUTO").train.memory_limit == "auto"
    assert _cfg("train.memory_limit=11").train.memory_limit == 11.0


def test_a_run_whose_peak_passes_the_limit_says_so_at_the_end(capsys):
    from rich.console import Console

    from grpo.tracking.console import RunConsole

    con = RunConsole(total_steps=1, console=Console(width=400, highlight=False, markup=False))
    summary = {"memory/peak_rss_mb": 5000.0, "memory/planned_peak_mb": 4000.0, "memory/limit_mb": 4500.0}
    con.summary({"steps": 1, "wall_s": 1.0, **summary}, Path("runs/x"), None)
    out = capsys.readouterr().out
    assert "planned 3.9 GiB within the 4.4 GiB limit" in out
    assert "warning: the measured peak, 4.9 GiB, was over train.memory_limit (4.4 GiB)" in out
    con.summary({"steps": 1, "wall_s": 1.0, **summary, "memory/peak_rss_mb": 4200.0}, Path("runs/x"), None)
    assert "warning" not in capsys.readouterr().out
