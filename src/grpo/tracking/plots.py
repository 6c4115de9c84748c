"""Plots drawn from metrics.jsonl (the source of truth): reward and held-out accuracy against steps."""

from __future__ import annotations

from pathlib import Path

from grpo.tracking.metrics import read_jsonl


def plot_run(run_dir: Path) -> list[Path]:
    """Write plots/reward.png and plots/accuracy.png (and plots/training.png with both); returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    out_dir = run_dir / "plots"
    out_dir.mkdir(exist_ok=True)
    steps = [r["step"] for r in rows if r.get("reward/mean") is not None]
    reward = [r["reward/mean"] for r in rows if r.get("reward/mean") is not None]
    acc = [(r["step"], r["eval/accuracy"]) for r in rows if r.get("eval/accuracy") is not None]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    axes[0].plot(steps, reward, color="tab:blue", lw=1, alpha=0.5, label="per step")
    if len(reward) >= 5:
        k = max(1, len(reward) // 20)
        smooth = [sum(reward[max(0, i - k):i + 1]) / len(reward[max(0, i - k):i + 1]) for i in range(len(reward))]
        axes[0].plot(steps, smooth, color="tab:blue", lw=2, label=f"moving mean ({k + 1})")
    axes[0].set(title="training reward (mean over the N completions)", xlabel="step", ylabel="reward")
    axes[0].legend(loc="lower right")
    if acc:
        axes[1].plot([s for s, _ in acc], [a for _, a in acc], "o-", color="tab:green")
    axes[1].set(title="held-out accuracy (greedy pass@1)", xlabel="step", ylabel="accuracy", ylim=(0, 1))
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    paths = [out_dir / "training.png"]
    fig.savefig(paths[0], dpi=110)
    for i, name in enumerate(("reward.png", "accuracy.png")):
        extent = axes[i].get_tightbbox(fig.canvas.get_renderer()).transformed(fig.dpi_scale_trans.inverted())
        fig.savefig(out_dir / name, dpi=110, bbox_inches=extent.expanded(1.05, 1.08))
        paths.append(out_dir / name)
    plt.close(fig)
    return paths
