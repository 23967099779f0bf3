"""`costmodel --plot`: the cost model as a picture. Left, spec tok/s against served accept length,
one line per all-reduce latency, each beside plain decoding at that latency (dashed) with its
break-even point; right (given accept_by_steps), tok/s against draft depth with the best depth
starred. Accept length is not speed: the left panel shows how far apart the lines sit."""

from __future__ import annotations

from drafter_lab.plotting import plt, save_png
from drafter_lab.spec.costmodel import CostModel, CostModelConfig, Latency, latency_at, on_allreduce
from drafter_lab.spec.costreport import best_row, steps_table, whatif_latencies

ACCEPT_POINTS = 41
"""Points along each accept-length line (1.0 to the largest accept length asked about, + 1)."""


def series(cfg: CostModelConfig, measured: Latency | None = None, priced: bool = True) -> list[dict]:
    """One entry per all-reduce latency (the config's own first, then the what-ifs): the tok/s line
    over accept length, plain decoding, break-even and the draft-steps rows at that latency. As in the
    text report, a `measured` all-reduce is the deployment's unless a flag set the config's (`priced`)."""
    cfg = on_allreduce(cfg, measured if priced else None)
    m = CostModel(cfg)
    top = max([*cfg.accept_lengths, *cfg.accept_by_steps, 2.0]) + 1.0
    xs = [1.0 + (top - 1.0) * i / (ACCEPT_POINTS - 1) for i in range(ACCEPT_POINTS)]
    rows = [(f"{cfg.verify_allreduce_us:g} us (this deployment)", cfg.verify_allreduce_us),
            *whatif_latencies(cfg, measured)]
    if measured is not None and priced:  # the deployment's line first (drawn bold), the preset's beside it
        rows = [(f"{rows[-1][0]} (this deployment)", measured), (f"{cfg.verify_allreduce_us:g} us (the preset)",
                                                                 cfg.verify_allreduce_us), *rows[1:-1]]
    out = []
    for label, latency in rows:
        out.append({
            "label": label, "allreduce_us": latency_at(latency, m.message_bytes), "accept": xs,
            "spec_tok_s": [m.spec_tok_s(a, latency) for a in xs],
            "baseline_tok_s": m.baseline_tok_s(latency), "break_even": m.break_even(latency),
            "steps": steps_table(cfg, latency),
        })
    return out


def plot(cfg: CostModelConfig, path, measured: Latency | None = None, title: str = "", priced: bool = True) -> None:
    lines = series(cfg, measured, priced)
    depth = bool(cfg.accept_by_steps)
    fig, axes = plt.subplots(1, 2 if depth else 1, figsize=(12 if depth else 6.5, 4.5), squeeze=False)
    ax = axes[0][0]
    for i, s in enumerate(lines):
        color, width = f"C{i}", 2.2 if i == 0 else 1.2
        ax.plot(s["accept"], s["spec_tok_s"], color=color, lw=width, label=f"all-reduce {s['label']}")
        ax.axhline(s["baseline_tok_s"], color=color, ls="--", lw=0.8)
        ax.plot([s["break_even"]], [s["baseline_tok_s"]], "o", color=color, ms=5)
    ax.set(xlabel="served accept length (tokens per verify step, bonus included)", ylabel="tok/s",
           title=title or "speculative tok/s; dashed: plain decoding, dot: break-even")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    if depth:
        ax = axes[0][1]
        for i, s in enumerate(lines):
            steps = [r["steps"] for r in s["steps"]]
            ax.plot(steps, [r["spec_tok_s"] for r in s["steps"]], marker="o", ms=3, color=f"C{i}",
                    lw=2.2 if i == 0 else 1.2, label=s["label"])
            best = best_row(s["steps"])
            ax.plot([best["steps"]], [best["spec_tok_s"]], "*", color=f"C{i}", ms=12)
            ax.axhline(s["baseline_tok_s"], color=f"C{i}", ls="--", lw=0.8)
        ax.set(xlabel="draft steps (chain; verify = steps + 1 tokens)", ylabel="tok/s",
               title="tok/s by draft depth (star: best)")
        ax.set_xticks(range(1, len(cfg.accept_by_steps) + 1))
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    save_png(fig, path)
