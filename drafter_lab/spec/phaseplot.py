"""`eval --plot`: where each decode's time goes, as a picture. Per setting, two stacked bars: the
speculative cycle and the target-only step, in ms per target pass split by phase, with the tok/s
ratio beside them. Rows of a batch sweep show the verify's share holding while the prefill's grows."""

from __future__ import annotations

from drafter_lab.plotting import plt, save_png
from drafter_lab.spec.phases import per_pass_ms

PHASES = ("prefill", "draft", "verify", "accept", "extend")


def bars(results: list[dict]) -> list[dict]:
    """One bar per (setting, decode): its label, the setting's tok/s ratio and ms per target pass by phase."""
    out = []
    for r in results:
        c = r["config"]
        setting = f"steps {c['steps']}, topk {c['topk']}, {c['draft_tokens']} tokens, batch {c['batch']}" \
                  + (" continuous" if c["schedule"] == "continuous" else "")
        for side, label in (("spec", "speculative"), ("baseline", "target only")):
            out.append({"label": f"{setting}: {label}", "side": side, "speedup": r["speedup"],
                        "ms": per_pass_ms(r, side)})
    return out


def plot(results: list[dict], path) -> None:
    rows = bars(results)
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.4 * len(rows)))
    ys = list(range(len(rows)))
    left = [0.0] * len(rows)
    for i, phase in enumerate(PHASES):
        widths = [r["ms"].get(phase, 0.0) for r in rows]
        ax.barh(ys, widths, left=left, color=f"C{i}", label="verify (target only: decode)" if phase == "verify" else phase)
        left = [a + w for a, w in zip(left, widths)]
    for y, r, total in zip(ys, rows, left):
        ratio = r["side"] == "spec" and r["speedup"] is not None  # null where the journal kept a NaN
        note = f"{total:.2f} ms" + (f", {r['speedup']:.2f}x tok/s" if ratio else "")
        ax.text(total, y, f" {note}", va="center", fontsize=7)
    ax.set_yticks(ys, [r["label"] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.25 * max(left) or 1.0)  # all phases zero: a zero-width axis warns
    ax.set(xlabel="ms per target pass (prefill spread over the passes)",
           title="where the time goes: a speculative cycle against a target-only step")
    ax.legend(fontsize=7, ncol=len(PHASES), loc="upper center", bbox_to_anchor=(0.5, -0.5 / len(rows) - 0.08))
    ax.grid(axis="x", alpha=0.3)
    save_png(fig, path)
