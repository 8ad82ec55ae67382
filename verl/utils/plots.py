"""PNG curves of a run (reward, validation EM, KL, entropy, searches; or a supervised run's loss) from its
metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

from verl.utils.tracking import read_metrics

PANELS = (
    ("train reward", ["critic/score/mean"]),
    ("validation EM", ["val/em", "val/em/demo_single", "val/em/demo_multi"]),
    ("KL to reference / old policy", ["actor/ppo_kl", "actor/kl_loss", "actor/reward_kl_penalty"]),
    ("entropy", ["actor/entropy"]),
    ("searches per trajectory", ["agent/searches_per_traj", "val/searches/demo_single", "val/searches/demo_multi"]),
    ("response length", ["agent/mean_response_len"]),
)


def plot_curves(metrics_path: str | Path, out_png: str | Path, title: str = "",
                panels: tuple[tuple[str, list[str]], ...] = PANELS) -> Path:
    """Draw one panel per quantity (``panels``: (title, metric keys); the RL trainer's by default); keys missing from
    the run are skipped."""
    import matplotlib  # here, not at import: pyplot costs ~0.45 s of every trainer's start-up

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(14 * cols / 3, 3.5 * rows), squeeze=False)
    for ax, (name, keys) in zip(axes.flat, panels):
        for key in keys:
            points = [(r["step"], r[key]) for r in records if key in r]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="." if len(points) < 30 else None, label=key)
        ax.set_title(name)
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(out_png)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
