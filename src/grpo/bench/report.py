"""The report of `grpo bench` (grpo/bench/run.py): fitted exponents, the acceptance checks against the issue's
thresholds, and the printed table."""

from __future__ import annotations

import math
import statistics

__all__ = ["HEADER", "acceptance", "exponents", "fit_exponent", "row", "summary"]


def fit_exponent(xs, ys) -> float:
    """Least-squares slope of log(y) against log(x)."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    den = sum((a - mx) ** 2 for a in lx)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / den if den else float("nan")


def exponents(runs: list[dict], length_sweep: list[dict]) -> dict:
    out = {"group_size": [], "completion_length": None}
    for model, shape in dict.fromkeys((r["model"], r["shape"]) for r in runs):
        rs = [r for r in runs if r["model"] == model and r["shape"] == shape]
        if len(rs) >= 2:
            Gs = [r["group_size"] for r in rs]
            out["group_size"].append({"model": model, "shape": shape, "group_sizes": Gs,
                                      "step": fit_exponent(Gs, [r["step_s"] for r in rs]),
                                      "floor": fit_exponent(Gs, [r["floor_s"] for r in rs])})
    if len(length_sweep) >= 2:
        Ts = [x["completion_tokens"] for x in length_sweep]
        out["completion_length"] = {"model": length_sweep[0]["model"], "shape": length_sweep[0]["shape"],
                                    "group_size": length_sweep[0]["group_size"], "completion_tokens": Ts,
                                    "step": fit_exponent(Ts, [x["step_s"] for x in length_sweep])}
    return out


def acceptance(result: dict, plan) -> list[dict]:
    """The issue's thresholds, on the first model (the built-in one) of `plan` (a grpo.bench.Plan)."""
    runs = result["runs"]
    model = plan.models[0].name
    default, long_ = plan.shapes[0].name, plan.shapes[1].name if len(plan.shapes) > 1 else None

    def get(shape, G, key):
        for r in runs:
            if r["model"] == model and r["shape"] == shape and r["group_size"] == G:
                return r[key]
        return None

    checks = [("step/floor, default shapes, G=16", get(default, 16, "step_over_floor"), "<=", 0.75),
              ("step/floor, default shapes, G=8", get(default, 8, "step_over_floor"), "<=", 0.9),
              ("step/floor, long prompt, G=16", get(long_, 16, "step_over_floor"), "<=", 0.4),
              ("rollout tokens/s vs transformers generate, default shapes, G=16",
               get(default, 16, "speedup_vs_hf_generate"), ">=", 2.0)]
    ex = result["exponents"]
    g = next((e for e in ex["group_size"] if e["model"] == model and e["shape"] == default), None)
    checks.append(("exponent of step time in G (default shapes)", g["step"] if g else None, "<=", 1.1))
    ln = ex["completion_length"]
    checks.append(("exponent of step time in completion length", ln["step"] if ln else None, "<=", 1.1))
    out = []
    for name, value, op, thr in checks:
        met = None if value is None else (value <= thr if op == "<=" else value >= thr)
        out.append({"check": name, "value": value, "threshold": f"{op} {thr}", "met": met})
    return out


HEADER = (f"{'model':<11} {'shape':<12} {'G':>3} {'step s':>8} {'floor s':>8} {'step/floor':>10} {'gen tok/s':>10} "
          f"{'hf tok/s':>9} {'vs hf':>6} {'peak MB':>8}   generate/reward/logprob/backward+opt s")


def row(r: dict) -> str:
    s = r["stages"]
    return (f"{r['model']:<11} {r['shape']:<12} {r['group_size']:>3} {r['step_s']:>8.3f} {r['floor_s']:>8.3f} "
            f"{r['step_over_floor']:>10.3f} {r['gen_tokens_per_s']:>10.0f} {r['hf_generate_tokens_per_s']:>9.0f} "
            f"{r['speedup_vs_hf_generate']:>6.2f} {r['peak_rss_mb']:>8.0f}   {s['generate_s']:.3f}/{s['reward_s']:.3f}/"
            f"{s['logprob_s']:.3f}/{s['backward_optimizer_s']:.3f}")


def summary(result: dict) -> str:
    title = (f"grpo bench  {result['device']} {result['dtype']}, {result['threads']} thread(s), {result['clock']} "
             f"seconds, medians of {result['repeats']}, run took {result['wall_s']:.0f} s")
    lines = [title, HEADER]
    lines += [row(r) for r in result["runs"] if r.get("kind") != "vocab"]
    lines.append("fitted exponents (slope of log step_s):")
    for e in result["exponents"]["group_size"]:
        lines.append(f"  vs G {e['group_sizes']}  {e['model']}/{e['shape']}: step {e['step']:.2f}   "
                     f"floor {e['floor']:.2f}")
    ln = result["exponents"]["completion_length"]
    if ln:
        lines.append(f"  vs completion length {ln['completion_tokens']}  {ln['model']}/{ln['shape']} "
                     f"G={ln['group_size']}: step {ln['step']:.2f}")
    lines.append("acceptance (built-in model):")
    for a in result["acceptance"]:
        v = "n/a" if a["value"] is None else f"{a['value']:.3f}"
        mark = {True: "met", False: "NOT met", None: "not measured"}[a["met"]]
        lines.append(f"  {a['check']}: {v} (want {a['threshold']}) {mark}")
    return "\n".join(lines)
