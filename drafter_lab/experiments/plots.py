"""PNG plots of a study: learning curves per arm, per-step conditional accuracy, drift sweep."""

from __future__ import annotations

from pathlib import Path

from drafter_lab.experiments.config import level_name
from drafter_lab.plotting import plt, save_png


def learning_curves(arms: list, path: Path, random_loss: float, watch_stop: int | None = None) -> None:
    """cond_acc_0 and loss_0 against step, validation points, one line per arm; `random_loss`
    (ln of the draft vocab size) marks where an uninformed drafter starts, and `watch_stop` the step
    at which the watch would have stopped arm (b)."""
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 4))
    for arm in arms:
        rows = [r for r in arm.history if r.get("split") == "val"]
        steps = [r["step"] for r in rows]
        ax_acc.plot(steps, [r["cond_acc_0"] for r in rows], marker="o", ms=3, label=arm.label)
        ax_loss.plot(steps, [r["loss_0"] for r in rows], marker="o", ms=3, label=arm.label)
    ax_acc.set(xlabel="optimizer step", ylabel="val cond_acc_0", title="first-token acceptance (val)")
    ax_loss.axhline(random_loss, color="grey", ls="--", lw=1, label=f"random level ln N = {random_loss:.2f}")
    ax_loss.set(xlabel="optimizer step", ylabel="val loss_0 (soft CE vs the target)", title="step-0 loss (val)")
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
        if watch_stop is not None:
            ax.axvline(watch_stop, color="tab:red", ls=":", lw=1.2,
                       label=f"the watch would stop (b) here (step {watch_stop})")
    ax_acc.legend(fontsize=8)
    ax_loss.legend(fontsize=8)
    save_png(fig, path)


def cond_acc_bars(arms: list, path: Path, ttt_steps: int) -> None:
    """Final validation cond_acc_k per TTT step k, grouped bars per arm."""
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(len(arms), 1)
    for i, arm in enumerate(arms):
        xs = [k + i * width for k in range(ttt_steps)]
        ax.bar(xs, [arm.final.get(f"cond_acc_{k}", 0.0) for k in range(ttt_steps)], width, label=arm.label)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(ttt_steps)], [f"k={k}" for k in range(ttt_steps)])
    ax.set(ylabel="val cond_acc_k", ylim=(0, 1), title="conditional accuracy per draft step (final, val)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    save_png(fig, path)


def speed_by_depth(drafters: list[dict], baselines: dict[float, float], path: Path) -> None:
    """report.speed_tables' drafters: tok/s against draft depth, one panel per all-reduce latency,
    plain decoding at that latency dashed, each drafter's best depth starred."""
    fig, axes = plt.subplots(1, len(baselines), figsize=(5.5 * len(baselines), 4), squeeze=False)
    for ax, (latency, plain) in zip(axes[0], baselines.items()):
        for i, d in enumerate(drafters):
            rows = d["tables"][latency]
            ax.plot([r["steps"] for r in rows], [r["spec_tok_s"] for r in rows], marker="o", ms=3, color=f"C{i}",
                    label=f"{d['label']} (served accept {d['served_accept_len']:.2f})")
            best = max(rows, key=lambda r: r["spec_tok_s"])
            ax.plot([best["steps"]], [best["spec_tok_s"]], "*", color=f"C{i}", ms=11)
        ax.axhline(plain, color="grey", ls="--", lw=1, label=f"plain decoding {plain:.0f} tok/s")
        ax.set(xlabel="draft steps (chain)", ylabel="tok/s (cost model)", title=f"{latency:g} us all-reduces")
        ax.set_xticks(sorted({r["steps"] for d in drafters for r in d["tables"][latency]}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_png(fig, path)


def drift_sweep(points: list[dict], path: Path) -> None:
    """Transfer gain ((b) - (a) at equal budget) against measured drift (1 - mean aux CKA); a level
    whose probe measured no CKA (drift None) has no place on the axis and is left out, as the title says."""
    unknown = sum(p["drift"] is None for p in points)
    points = [p for p in points if p["drift"] is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [p["drift"] for p in points]
    ys = [100 * p["gain"] for p in points]
    colors = ["tab:green" if p["verdict_matches"] else "tab:red" for p in points]
    ax.axhline(0, color="grey", lw=1)
    ax.plot(xs, ys, color="tab:blue", alpha=0.5)
    ax.scatter(xs, ys, c=colors, zorder=3)
    for p in points:
        ax.annotate(f"knob {level_name(p['drift_knob'])}\n{p['verdict']}", (p["drift"], 100 * p["gain"]), fontsize=7,
                    textcoords="offset points", xytext=(4, 4))
    for color, text in (("tab:green", "probe verdict = measured outcome"), ("tab:red", "probe verdict wrong")):
        ax.scatter([], [], c=color, label=text)
    ax.legend(fontsize=7, loc="lower left")
    ax.set(xlabel="measured drift: 1 - mean aux-layer CKA (base vs tuned)",
           ylabel="transfer gain, points of val cond_acc_0", title="When does transferring a drafter pay?"
           + (f"\n({unknown} level(s) without an aux CKA not shown)" if unknown else ""))
    ax.grid(alpha=0.3)
    save_png(fig, path)
