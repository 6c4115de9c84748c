"""Long phases show progress: a line every few seconds with the ETA in a log, a bar in a terminal (joining the live
step bar when one runs); and the run's wall time with its parts."""

from __future__ import annotations

import io

from rich.console import Console

from grpo.tracking.clock import RunClock, breakdown
from grpo.tracking.console import RunConsole
from grpo.tracking.progress import Phase, eta_seconds, format_duration


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def log_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, width=200, highlight=False, markup=False), buf


def test_durations_and_eta():
    assert [format_duration(s) for s in (0.04, 4.25, 42, 125, 3725)] == ["0.0 s", "4.2 s", "42 s", "2 min 05 s",
                                                                        "1 h 02 min"]
    assert eta_seconds(30.0, 300, 1000) == 70.0  # 0.1 s a unit, 700 left
    assert eta_seconds(30.0, 0, 1000) is None and eta_seconds(30.0, 5, None) is None


def test_a_log_gets_a_line_every_few_seconds_with_the_eta_and_one_at_the_end():
    console, buf = log_console()
    clock = FakeClock()
    with Phase("warm-up", 1000, "steps", console=console, every_s=5.0, clock=clock) as ph:
        for step in range(1, 1001):
            clock.t += 0.125  # a line every 40 steps (5 s)
            ph.update(step, info=f"loss {1 / step:.3f}")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1000 // 40 + 1
    assert lines[0] == "[grpo] warm-up: 40/1000 steps (4%), 5.0 s elapsed, eta 2 min 00 s, loss 0.025"
    assert lines[1] == "[grpo] warm-up: 80/1000 steps (8%), 10 s elapsed, eta 1 min 55 s, loss 0.013"
    assert lines[-2] == "[grpo] warm-up: 1000/1000 steps (100%), 2 min 05 s elapsed, loss 0.001"  # no eta when done
    assert lines[-1] == "[grpo] warm-up: done in 2 min 05 s" and ph.elapsed == 125.0


def test_a_short_phase_is_silent_and_a_disabled_one_still_times():
    console, buf = log_console()
    clock = FakeClock()
    with Phase("evaluating", 500, "problems", console=console, clock=clock) as ph:
        clock.t += 2.0
        ph.update(500)
    assert buf.getvalue() == "" and ph.elapsed == 2.0
    with Phase("evaluating", 500, console=console, enabled=False, clock=clock) as quiet:
        clock.t += 60.0
        quiet.update(250)
    assert buf.getvalue() == "" and quiet.elapsed == 60.0


def test_in_a_terminal_a_phase_joins_the_live_step_bar():
    buf = io.StringIO()
    con = RunConsole(10, console=Console(file=buf, force_terminal=True, width=120))
    con.start()
    with con.phase("evaluating", 500, "problems") as ph:
        assert ph.live is con._progress and len(con._progress.tasks) == 2  # one live display: a second row
        ph.update(250)
        assert con._progress.tasks[1].completed == 250
    assert len(con._progress.tasks) == 1  # the row goes when the phase ends
    con.stop()
    with con.phase("saving", 3, "files") as own:  # no step bar: a bar of its own, gone at the end
        assert own._own is not None
        own.update(3)
    assert own._own.live.is_started is False


def test_the_wall_time_parts_add_up():
    clock = RunClock({"eval": 2.0})  # resumed: the saved parts carry on
    clock.add("model", 1.5)
    clock.add("rl_steps", 30.0)
    clock.add("preflight", 1.25)
    summary = clock.summary(40.0)
    assert summary == {"time/model_s": 1.5, "time/preflight_s": 1.25, "time/eval_s": 2.0, "time/rl_steps_s": 30.0,
                       "time/save_s": 0.0, "time/other_s": 5.25}
    assert breakdown(summary) == ("model 1.5 s, preflight 1.2 s, evaluations 2.0 s, RL steps 30 s, saving 0.0 s, "
                                  "other 5.2 s")
    old = {k: v for k, v in summary.items() if k != "time/preflight_s"}  # a summary.json written before the part
    assert breakdown(old) == "model 1.5 s, evaluations 2.0 s, RL steps 30 s, saving 0.0 s, other 5.2 s"
    assert RunClock(clock.state_dict()).summary(40.0) == summary
