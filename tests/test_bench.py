"""`grpo bench --json` runs end to end on the quick (tiny) plan and prints/writes the documented object.
Timings live in the benchmark, never in these assertions."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from grpo.bench import fit_exponent
from grpo.config import ConfigError

RUN_KEYS = {"model", "shape", "group_size", "step_s", "floor_s", "step_over_floor", "gen_tokens_per_s",
            "hf_generate_tokens_per_s", "speedup_vs_hf_generate", "peak_rss_mb"}


@pytest.mark.slow
def test_bench_json_quick(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-c", "import sys; from grpo.cli import main; sys.exit(main())", "bench",
                           "--json", "--quick", "--output", str(out)], check=False, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout.strip().splitlines()[-1])  # --json: the object is printed last
    assert printed == json.loads(out.read_text())
    runs = [r for r in printed["runs"] if r.get("kind") != "vocab"]
    vocab_runs = [r for r in printed["runs"] if r.get("kind") == "vocab"]
    assert runs[0]["model"] == "builtin" and runs[0]["shape"] == "default"
    models = list(dict.fromkeys(r["model"] for r in runs))
    shapes = list(dict.fromkeys(r["shape"] for r in runs))
    Gs = sorted({r["group_size"] for r in runs})
    assert len(models) == 2 and len(shapes) == 2 and len(runs) == len(models) * len(shapes) * len(Gs)
    for r in runs:
        assert RUN_KEYS <= r.keys()
        assert all(r[k] > 0 for k in RUN_KEYS - {"model", "shape"})
        assert r["gen_tokens"] == r["prompts"] * r["group_size"] * r["completion_tokens"]
        assert set(r["stages"]) == {"generate_s", "reward_s", "logprob_s", "backward_optimizer_s"}
    assert printed["exponents"]["group_size"] and printed["exponents"]["completion_length"]
    # the real-vocabulary part: two lengths at one N, our update and the floor, and the generation comparison
    assert printed["models"]["qwen2-vocab152k"]["vocab_size"] == 151_936
    assert all("vocab_size" in m for m in printed["models"].values())
    assert len({r["completion_tokens"] for r in vocab_runs}) == 2 and len({r["completions"] for r in vocab_runs}) == 1
    for r in vocab_runs:
        assert all(r[k] > 0 for k in ("update_peak_mb", "floor_update_peak_mb", "update_s", "floor_update_s"))
    assert {g["top_p"] for g in printed["vocab"]["generation"]} == {1.0, 0.9}
    assert all(g["gen_tokens_per_s"] > 0 and g["hf_generate_tokens_per_s"] > 0 for g in printed["vocab"]["generation"])
    assert {a["check"] for a in printed["acceptance"]}
    assert "step/floor" in proc.stdout and "exponent" in proc.stdout


def test_fit_exponent():
    assert fit_exponent([1, 2, 4, 8], [3, 6, 12, 24]) == pytest.approx(1.0)
    assert fit_exponent([2, 4, 8], [5, 5 * 2 ** 0.5, 10]) == pytest.approx(0.5)


def test_async_bench_aggregates_seeds_and_ratios_by_hand():
    from grpo.bench.async_rollouts import aggregate, overrides

    def run(mode, seed, spm, gain):
        return {"mode": mode, "seed": seed, "steps_per_min": spm, "steady_steps_per_min": spm * 2,
                "gain_per_min": gain, "gain_per_1k_completions": gain / 10, "accuracy_after": 0.5,
                "staleness_mean": 1.0 if mode == "async" else 0.0, "wait_s_mean": 0.0}

    runs = [run("sync", 0, 10.0, 0.1), run("async", 0, 14.0, 0.2), run("sync", 1, 12.0, 0.3),
            run("async", 1, 16.0, 0.2)]
    agg = aggregate(runs)
    assert agg["sync"]["steps_per_min"]["mean"] == 11.0 and agg["async"]["steps_per_min"]["mean"] == 15.0
    assert abs(agg["sync"]["steps_per_min"]["std"] - 2 ** 0.5) < 1e-12  # sample std of (10, 12)
    assert abs(agg["async_over_sync"]["steps_per_min"] - 15 / 11) < 1e-12
    assert abs(agg["async_over_sync"]["gain_per_min"] - 0.2 / 0.2) < 1e-12
    assert "async_over_sync_1thread" not in agg  # no sync_1thread run: no ratio to it
    ov = overrides({"steps": 5, "max_staleness": 1, "extra": [], "model": None}, "sync_1thread", 2)
    assert "rollout.mode=sync" in ov and "train.seed=2" in ov and "eval.val_n=0" in ov


def test_async_bench_spec_takes_the_command_lines_overrides_last_and_refuses_them_elsewhere(capsys):
    from argparse import Namespace

    from grpo.bench.async_rollouts import MODEL_EXTRA, overrides, spec_from_args
    from grpo.cli import main

    def args(*overrides, output="x.json"):
        return Namespace(model="builtin:tiny", quick=False, steps=None, repeats=2, overrides=list(overrides),
                         output=output)

    spec = spec_from_args(args("kl.coef=0.04"))
    assert spec["modes"] == ["sync", "async"] and spec["steps"] == 20 and spec["repeats"] == 2  # the real-model shape
    ov = overrides(spec, "async", 0)
    assert ov.index("kl.coef=0.04") > max(ov.index(x) for x in MODEL_EXTRA)  # later overrides win
    assert "rollout.mode=async" in ov and "rollout.prompts_per_step=4" in ov
    assert main(["bench", "kl.coef=0.04"]) == 2  # without --async-rollouts the overrides would be ignored
    assert "apply to --async-rollouts runs only" in capsys.readouterr().err
    for bad, message in ((["rollout.mode=async"], "sets ['rollout.mode=async'] itself"),  # every row would be async
                         (["train.seed=3"], "sets ['train.seed=3'] itself"), (["log.plots=true"], "itself"),
                         (["kl.coef=-1"], "kl.coef")):                    # checked before the first run
        with pytest.raises(ConfigError, match=re.escape(message)):
            spec_from_args(args(*bad))
    with pytest.raises(ConfigError, match="name the results file with --output"):  # not over the quoted default
        spec_from_args(args("kl.coef=0.04", output=None))
