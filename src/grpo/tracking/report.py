"""`grpo report RUN_DIR`: one self-contained HTML page of a run: the summary (before, best and final accuracy), the
reward and accuracy curves from step 0, the training dynamics (each reward function, KL, entropy, clip fraction,
lengths), a metrics table, sample groups and the config. Images are embedded as data: URLs (no other file needed)."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from grpo.tracking.metrics import read_jsonl

ENV_KEYS = ["env/turns_mean", "env/tool_calls_mean", "env/tool_errors_frac", "env/truncated_frac"]
KEYS = ["reward/mean", "reward/std", "adv/zero_std_frac", "rollout/len_mean", "rollout/truncated_frac", "loss/policy",
        "policy/clip_frac", "policy/entropy", "policy/kl", "perf/step_s", "eval/val_accuracy", "eval/accuracy"]


def _fmt(v) -> str:
    """Any field of the run directory as HTML text: a float formatted, everything else escaped (a run directory is
    data: a step, a prompt or a key may hold `<script>`)."""
    return f"{v:.4g}" if type(v) is float else html.escape(str(v))


def _shown(row: dict, every: int) -> bool:
    step = row.get("step")
    return type(step) is not int or step % every == 0 or "eval/accuracy" in row or "eval/val_accuracy" in row


def _completion(sample: dict, j: int, text: str) -> str:
    """A completion's cell: its text, or for an episode every turn, marked policy or environment (its role)."""
    episodes = sample.get("episodes")
    if not episodes or episodes[j] is None:
        return f"<code>{_fmt(text)}</code>"
    turns = "".join(
        f'<div class="turn {"policy" if t.get("role") == "policy" else "env"}"><b>[{_fmt(t.get("role"))}]</b> '
        f"<code>{_fmt(t.get('text'))}</code></div>" for t in episodes[j]["turns"])
    end = episodes[j].get("end", "")
    return turns + (f"<div><i>ended: {_fmt(end)}</i></div>" if end else "")


def write_report(run_dir: Path) -> Path:
    """Write run_dir/report.html and return its path. Raises RunDirError (a UserError and a FileNotFoundError)
    naming what is wrong when run_dir is not a readable run directory."""
    from grpo.tracking.rundir import check_run_dir, write_text_atomic

    run_dir = check_run_dir(run_dir)
    from grpo.tracking.plots import plot_run

    from grpo.tracking.plots import reward_function_keys

    plots = plot_run(run_dir)
    images = "".join(f'<img alt="{p.stem}" src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}" '
                     'style="max-width:100%">' for p in (plots[0], plots[-1]))  # training.png, dynamics.png
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    rows = read_jsonl(run_dir / "metrics.jsonl")
    samples = read_jsonl(run_dir / "samples.jsonl")[-4:]
    config = (run_dir / "config.yaml").read_text() if (run_dir / "config.yaml").exists() else ""
    keys = KEYS[:2] + reward_function_keys(rows) + KEYS[2:]
    if any("env/turns_mean" in r for r in rows):  # multi-turn episodes (grpo.rollout.episodes)
        keys += ENV_KEYS
    every = max(1, len(rows) // 30)
    table = "".join(
        "<tr>" + f"<td>{_fmt(r.get('step'))}</td>" + "".join(f"<td>{_fmt(r.get(k, ''))}</td>" for k in keys)
        + "</tr>" for r in rows if _shown(r, every)
    )
    groups = "".join(
        f"<h3>step {_fmt(s.get('step'))}: {_fmt(str(s.get('prompt', '')).strip())} (answer {_fmt(s.get('answer'))})"
        "</h3>"
        f"<p>mean {_fmt(s.get('reward_mean'))}, std {_fmt(s.get('reward_std'))}</p><table><tr><th>completion</th>"
        "<th>reward</th><th>advantage</th></tr>"
        + "".join(f"<tr><td>{_completion(s, j, c)}</td><td>{_fmt(r)}</td><td>{_fmt(a)}</td></tr>"
                  for j, (c, r, a) in enumerate(zip(s.get("completions", []), s.get("rewards", []),
                                                    s.get("advantages", []))))
        + "</table>"
        for s in samples
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>grpo run {html.escape(run_dir.name)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 6px;font-size:13px}}.turn.env{{color:#555;background:#f3f3f3}}pre{{background:#f5f5f5;padding:1em}}</style></head><body>
<h1>grpo run {html.escape(run_dir.name)}</h1>
<table>{''.join(f'<tr><th>{_fmt(k)}</th><td>{_fmt(v)}</td></tr>' for k, v in summary.items())}</table>
{images}
<h2>Metrics</h2><table id="metrics"><tr><th>step</th>{''.join(f'<th>{_fmt(k)}</th>' for k in keys)}</tr>{table}</table>
<h2>Sample groups</h2><div id="samples">{groups}</div><h2>Config</h2><pre>{html.escape(config)}</pre></body></html>"""
    out = run_dir / "report.html"
    write_text_atomic(out, page)  # whole or not at all; a full disk: DiskFullError naming it and the bytes needed
    return out
