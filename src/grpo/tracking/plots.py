"""Plots drawn from metrics.jsonl (the source of truth).

- plots/training.png: training reward and accuracy against steps (also cut into reward.png and accuracy.png). The
  validation curve starts at step 0, the accuracy before training (metrics.jsonl's step-0 row), and marks the best
  evaluation (the one kept in checkpoints/best/); the test accuracy (before and after, and every eval.test_every
  steps when set) is drawn as squares.
- plots/dynamics.png: what explains the curves: each reward function's mean, the KL to the reference (`policy/kl`,
  and `loss/kl`), the policy entropy, the clipped fraction, and the completion lengths with the truncated share.
"""

from __future__ import annotations

import io
from pathlib import Path

from grpo.tracking.metrics import read_jsonl

_NOT_FUNCTIONS = {"mean", "std", "missing_frac"}


def reward_function_keys(rows: list[dict]) -> list[str]:
    """The per-function reward keys of the rows: `reward/<name>` (not reward/mean, /std, /missing_frac, nor the
    per-function `reward/<name>/<stat>` keys), in first-seen order."""
    keys: dict[str, None] = {}
    for r in rows:
        for k in r:
            parts = k.split("/")
            if len(parts) == 2 and parts[0] == "reward" and parts[1] not in _NOT_FUNCTIONS:
                keys[k] = None
    return list(keys)


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    # a point is an int step and a number (a run directory is data: anything else is not plotted)
    pts = [(r["step"], r[key]) for r in rows if type(r.get("step")) is int and type(r.get(key)) in (int, float)]
    return [s for s, _ in pts], [v for _, v in pts]


def _smooth(values: list[float]) -> tuple[int, list[float]]:
    k = max(1, len(values) // 20)
    return k + 1, [sum(values[max(0, i - k):i + 1]) / len(values[max(0, i - k):i + 1]) for i in range(len(values))]


def plot_run(run_dir: Path) -> list[Path]:
    """Write plots/training.png (reward and accuracy), plots/reward.png, plots/accuracy.png and plots/dynamics.png;
    returns the paths, training.png first and dynamics.png last."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    out_dir = run_dir / "plots"
    out_dir.mkdir(exist_ok=True)
    steps, reward = _series(rows, "reward/mean")
    acc_steps, acc = _series(rows, "eval/val_accuracy")  # chosen on: validation
    test_steps, test = _series(rows, "eval/accuracy")  # reported: test, before and after
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    axes[0].plot(steps, reward, color="tab:blue", lw=1, alpha=0.5, label="per step")
    if len(reward) >= 5:
        k, smooth = _smooth(reward)
        axes[0].plot(steps, smooth, color="tab:blue", lw=2, label=f"moving mean ({k})")
    axes[0].set(title="training reward (mean over the N completions)", xlabel="step", ylabel="reward")
    axes[0].legend(loc="lower right")
    if acc:
        axes[1].plot(acc_steps, acc, "o-", color="tab:green", label="validation accuracy")
        best = max(range(len(acc)), key=lambda i: (acc[i], -acc_steps[i]))  # the first of the highest
        axes[1].plot([acc_steps[best]], [acc[best]], "*", color="tab:red", ms=14,
                     label=f"best {acc[best]:.3f} (step {acc_steps[best]})")
    if test:
        axes[1].plot(test_steps, test, "s", color="tab:purple", ms=8,
                     label="test accuracy " + " -> ".join(f"{a:.3f}" for a in test))
    if acc or test:
        axes[1].legend(loc="lower right", fontsize=8)
    axes[1].set(title="accuracy (greedy pass@1)", xlabel="step", ylabel="accuracy", ylim=(0, 1))
    for ax in axes:
        ax.grid(alpha=0.3)
        if (acc_steps or test_steps) and min(acc_steps + test_steps) == 0:
            ax.set_xlim(left=0)
    fig.tight_layout()
    paths = [out_dir / "training.png"]
    _save(fig, paths[0], dpi=110)
    for i, name in enumerate(("reward.png", "accuracy.png")):
        extent = axes[i].get_tightbbox(fig.canvas.get_renderer()).transformed(fig.dpi_scale_trans.inverted())
        _save(fig, out_dir / name, dpi=110, bbox_inches=extent.expanded(1.05, 1.08))
        paths.append(out_dir / name)
    plt.close(fig)
    paths.append(plot_dynamics(rows, out_dir / "dynamics.png"))
    return paths


def _save(fig, path: Path, **kwargs) -> None:
    """The figure drawn in memory, then written whole or not at all: a full disk is one DiskFullError naming the
    disk and the bytes the image needed, never half a PNG."""
    from grpo.tracking.rundir import write_bytes_atomic

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", **kwargs)
    write_bytes_atomic(path, buffer.getvalue())


def plot_dynamics(rows: list[dict], path: Path) -> Path:
    """Per-reward means, KL, entropy, clip fraction and lengths against steps, in one 2x3 figure."""
    import matplotlib.pyplot as plt

    panels = [
        ("reward functions (mean per step)", [(k, k.split("/", 1)[1]) for k in reward_function_keys(rows)], None),
        ("KL to the reference (nats/token)", [("policy/kl", "policy/kl"), ("loss/kl", "loss/kl")], None),
        ("policy entropy (nats/token)", [("policy/entropy", "entropy")], None),
        ("clipped fraction of tokens", [("policy/clip_frac", "clip_frac")], (0, None)),
        ("completion length (tokens)", [("rollout/len_mean", "mean"), ("rollout/len_max", "max")], (0, None)),
        ("truncated / zero-spread share", [("rollout/truncated_frac", "truncated"),
                                           ("adv/zero_std_frac", "zero-spread groups")], (0, 1.05)),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.4))
    for ax, (title, series, ylim) in zip(axes.flat, panels):
        drawn = 0
        for key, label in series:
            steps, values = _series(rows, key)
            if values:
                ax.plot(steps, values, lw=1.4, marker="." if len(values) < 30 else None, label=label)
                drawn += 1
        if drawn:
            ax.legend(fontsize=8, loc="best")
        else:
            ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes,
                    color="grey")
        ax.set(title=title, xlabel="step")
        if ylim is not None:
            ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, path, dpi=100)
    plt.close(fig)
    return path
