"""`grpo bench --versus-trl --quick` on the built-in model: both trainers take their steps in their own processes,
and the figures it reports hang together (stages inside the step, the ratio from the medians)."""

from __future__ import annotations

import json

import pytest

from grpo.cli import main


@pytest.mark.slow
def test_quick_run_of_ours_against_trl(tmp_path, capsys):
    out = tmp_path / "vs.json"
    assert main(["bench", "--versus-trl", "--quick", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["spec"]["prompts"] * result["spec"]["group"] == 4 and result["versions"]["trl"]
    for method in ("ours", "trl"):
        (run,) = result["runs"][method]
        (step,) = run["steps"]  # --quick: one timed step after the warm-up
        assert step["step_s"] > 0 and step["generate_s"] > 0 and step["tokens"] > 0
        assert step["generate_s"] + step["reward_s"] <= step["step_s"] * 1.001  # the stages lie inside the step
        assert run["peak_rss_mb"] > 100
    med = result["median"]
    assert result["ours_over_trl"]["step_s"] == pytest.approx(med["ours"]["step_s"] / med["trl"]["step_s"])
    assert "ours / TRL" in capsys.readouterr().out
