"""The cost model's tables (draft steps, swept settings, batches, what-if all-reduce latencies) and
its printed report: what `drafter-lab costmodel` shows."""

from __future__ import annotations

import dataclasses

from drafter_lab.spec.costinputs import drafting, served_accept
from drafter_lab.spec.costmodel import CostModel, CostModelConfig, Latency, latency_at, on_allreduce, us_text


def settings_table(cfg: CostModelConfig, sweep: list[dict], latency: Latency | None = None, path=None) -> list[dict]:
    """One row per swept eval (`eval --steps 2,4 --topk 1,2 ...`): its served accept length priced at
    its own steps and verified tokens (the all-reduce at `latency`, None: the config's own, for that
    many tokens' message; a given `latency` is the deployment's, which a measured verify_ms is split at)."""
    cfg = on_allreduce(cfg, latency)
    rows = []
    for e in sweep:
        m = CostModel(drafting(cfg, e, path))
        accept = served_accept(e["served_accept_len"], "served_accept_len", path)
        c = e["config"]
        rows.append({"steps": c["steps"], "topk": m.cfg.topk, "draft_tokens": m.cfg.verify_tokens - 1,
                     "batch": m.cfg.batch, "accept": accept, **_priced(m, accept, latency)})
    return rows


def _priced(m: CostModel, accept: float, latency: Latency | None) -> dict:
    """A table row's timings and tok/s at all-reduce `latency` (None: the config's own); its
    all-reduce latency is None on a deployment without all-reduces (one device)."""
    x = m.cfg.verify_allreduce_us if latency is None else latency_at(latency, m.message_bytes)
    x = x if m.n_allreduce else None
    tok_s = m.spec_tok_s(accept, latency)
    return {"allreduce_us": x, "verify_ms": m.verify_ms(latency), "cycle_ms": m.cycle_ms(latency),
            "spec_tok_s": tok_s, "speedup": tok_s / m.baseline_tok_s(latency)}


def steps_table(cfg: CostModelConfig, latency: Latency | None = None) -> list[dict]:
    """One row per draft depth s of `cfg.accept_by_steps`: the cycle at s steps and its tok/s, with
    the verify all-reduce at `latency` (None: the config's own) for an s + 1 token message."""
    base = CostModel(cfg)
    return [{"steps": s, "accept": accept, **_priced(base.at_steps(s), accept, latency)}
            for s, accept in enumerate(cfg.accept_by_steps, start=1)]


def batch_table(cfg: CostModelConfig, latency: Latency | None = None) -> list[dict]:
    """One row per batch of `cfg.batches`: the same drafting with that many sequences, plain decoding's
    tok/s, the break-even accept length and spec tok/s at each accept length."""
    rows = []
    for b in cfg.batches:
        m = CostModel(dataclasses.replace(cfg, batch=b))
        base = m.baseline_tok_s(latency)
        rows.append({
            "batch": b, "verify_ms": m.verify_ms(latency), "cycle_ms": m.cycle_ms(latency),
            "decode_ms": m.decode_ms(latency), "baseline_tok_s": base, "break_even_accept_len": m.break_even(latency),
            "spec_tok_s": {f"{a:g}": m.spec_tok_s(a, latency) for a in cfg.accept_lengths},
            "speedup": {f"{a:g}": m.spec_tok_s(a, latency) / base for a in cfg.accept_lengths},
        })
    return rows


def best_row(rows: list[dict]) -> dict | None:
    """The steps-table row with the most tok/s (None for an empty table)."""
    return max(rows, key=lambda r: r["spec_tok_s"]) if rows else None


def whatif_latencies(cfg: CostModelConfig, measured: Latency | None = None) -> list[tuple[str, Latency]]:
    """(label, all-reduce latency) of the what-if rows: the config's list, then the measured one."""
    rows: list[tuple[str, Latency]] = [(f"{x:g} us", x) for x in cfg.whatif_allreduce_us]
    if measured is not None:
        rows.append((f"measured {us_text(latency_at(measured, CostModel(cfg).message_bytes))} us", measured))
    return rows


def report(cfg: CostModelConfig, measured: Latency | None = None, priced: bool = True) -> dict:
    """Every figure (headline, break-even, draft steps, batches) at one all-reduce, so that batch 1
    repeats the headline: the `measured` one an input gave, else the config's; `measured` also gets a
    what-if row. `priced` False: a flag set the config's all-reduce, and `measured` is that row alone."""
    given = cfg
    at = measured if priced else None
    cfg = on_allreduce(cfg, at)
    m = CostModel(cfg)
    measured_us = None if measured is None else latency_at(measured, m.message_bytes)
    rows = whatif_latencies(cfg, measured)
    steps = steps_table(cfg, at)
    return {
        "config": dataclasses.asdict(given),
        "n_allreduce": m.n_allreduce,
        "allreduce_measured": at is not None,
        "verify_allreduce_us": cfg.verify_allreduce_us if at is None else measured_us,
        "decode_allreduce_us": m.decode_allreduce_us(at),
        "verify_compute_ms": m.verify_compute_ms,
        # a pass table prices the verify whole: the per-layer split it replaces may come to anything
        "layer_compute_us": None if cfg.pass_ms_by_tokens else m.layer_compute_us,
        "verify_ms": m.verify_ms(at),
        "draft_step_us": m.draft_step_us,
        "first_draft_us": m.first_draft_us,
        "draft_ms": m.draft_ms,
        "cycle_ms": m.cycle_ms(at),
        "decode_ms": m.decode_ms(at),
        "decode_compute_ms": m.decode_compute_ms,
        "baseline_tok_s": m.baseline_tok_s(at),
        "break_even_accept_len": m.break_even(at),
        "spec_tok_s": {f"{a:g}": m.spec_tok_s(a, at) for a in cfg.accept_lengths},
        "measured_allreduce_us": measured_us,
        "message_bytes": m.message_bytes,
        "steps_table": steps,
        "best_steps": best_row(steps),
        "whatif": [_whatif(cfg, m, label, x) for label, x in rows],
        "batch_table": batch_table(cfg, at),
    }


def _whatif(cfg: CostModelConfig, m: CostModel, label: str, latency: Latency) -> dict:
    base = m.baseline_tok_s(latency)
    return {
        "allreduce": label,
        "allreduce_us": latency_at(latency, m.message_bytes),
        "verify_ms": m.verify_ms(latency),
        "baseline_tok_s": base,
        "break_even_accept_len": m.break_even(latency),
        "spec_tok_s": {f"{a:g}": m.spec_tok_s(a, latency) for a in cfg.accept_lengths},
        "speedup": {f"{a:g}": m.spec_tok_s(a, latency) / base for a in cfg.accept_lengths},
        "best_steps": best_row(steps_table(cfg, latency)),
    }


def format_report(r: dict, name: str) -> str:
    c = r["config"]
    accepts = [f"{a:g}" for a in c["accept_lengths"]]
    batched = c["batch"] > 1
    lines = [
        f"cost model: {name}" + (f" (batch {c['batch']}: tok/s counts all {c['batch']} sequences)" if batched else ""),
        "  verify   = "
        + (f"measured pass of {c['batch']} x {c['verify_tokens']} tokens, {r['verify_compute_ms']:.2f} ms"
           if c["pass_ms_by_tokens"] else
           f"{c['num_layers']} layers x {us_text(r['layer_compute_us'])} us compute"
           + (f" (+ {us_text(r['verify_compute_ms'] * 1000 / c['num_layers'] - r['layer_compute_us'])} us for the "
              f"batch's other {c['batch'] - 1} x {c['verify_tokens']} tokens)" if batched else ""))
        + (f" + {r['n_allreduce']} all-reduces x {us_text(r['verify_allreduce_us'])} us"
           + (" (measured)" if r["allreduce_measured"] else "") if r["n_allreduce"] else "")
        + f" = {r['verify_ms']:.2f} ms",
        f"  draft    = {_first_draft(c, r)} steps x {us_text(r['draft_step_us'])} us = {r['draft_ms']:.2f} ms; "
        f"overhead {c['cycle_overhead_ms']:.2f} ms; cycle = {r['cycle_ms']:.2f} ms"
        + (f"; {_percent(c['no_draft_share'])} of cycles draft nothing and decode plainly"
           if c["no_draft_share"] else ""),
        f"  baseline = {r['decode_ms']:.2f} ms per decode step = {r['baseline_tok_s']:.1f} tok/s"
        + _parenthesised([f"its all-reduces: {us_text(r['decode_allreduce_us'])} us each" if r["n_allreduce"] else "",
                          f"overhead {c['decode_overhead_ms']:.2f} ms" if c["decode_overhead_ms"] else ""]),
        "  spec tok/s by served accept length (bonus included): "
        + ", ".join(f"{a} -> {v:.1f}" for a, v in r["spec_tok_s"].items()),
        f"  break-even served accept length: {r['break_even_accept_len']:.2f}",
        "",
    ]
    steps = bool(r["steps_table"])
    if not r["n_allreduce"]:  # every what-if row would be the same: the latency multiplies no all-reduce
        lines.append("what-if: none (no all-reduce in the verify step: allreduces_per_layer 0)")
    else:
        lines.append(f"what-if: spec tok/s (speedup vs plain decoding with the same all-reduce); "
                     f"verify message {r['message_bytes'] / 1024:.0f} KiB")
        head = f"{'all-reduce':>18} {'verify ms':>9} {'base tok/s':>10} {'break-even':>10} | " + " ".join(
            f"{'A=' + a:>15}" for a in accepts
        ) + (f" | {'best steps':>19}" if steps else "")
        lines += [head, "-" * len(head)]
        for row in r["whatif"]:
            cells = " ".join(f"{row['spec_tok_s'][a]:>7.1f} ({row['speedup'][a]:.2f}x)" for a in accepts)
            best = row["best_steps"]
            lines.append(
                f"{row['allreduce']:>18} {row['verify_ms']:>9.2f} {row['baseline_tok_s']:>10.1f} "
                f"{row['break_even_accept_len']:>10.2f} | {cells}"
                + (f" | {best['steps']:>2}: {best['spec_tok_s']:>6.1f} ({best['speedup']:.2f}x)" if steps else "")
            )
    if steps:
        best = r["best_steps"]
        lines += [
            "",
            "draft steps (chain; served accept at each depth, accept_by_steps; verify = steps + 1 tokens"
            + (("; the measured all-reduce at each depth's message" if r["allreduce_measured"]
                else f", {us_text(c['verify_allreduce_us'])} us per all-reduce") if r["n_allreduce"] else "") + "):",
            f"{'steps':>5} {'accept':>6} {'verify ms':>9} {'cycle ms':>8} {'spec tok/s':>10} {'speedup':>7}",
        ]
        lines += [f"{row['steps']:>5} {row['accept']:>6.2f} {row['verify_ms']:>9.2f} {row['cycle_ms']:>8.2f} "
                  f"{row['spec_tok_s']:>10.1f} {row['speedup']:>6.2f}x" for row in r["steps_table"]]
        lines.append(f"best: {best['steps']} steps, {best['spec_tok_s']:.1f} tok/s; "
                     + _serve_flags(best["steps"], 1, best["steps"])
                     + ("" if best["speedup"] >= 1 else
                        f"; still slower than plain decoding ({r['baseline_tok_s']:.1f} tok/s) at every depth"))
    if r.get("settings"):
        lines += [
            "",
            "settings (an eval sweep; each served accept length priced at its own steps, verified tokens "
            "and batch):",
            f"{'steps':>5} {'topk':>4} {'draft tokens':>12} {'batch':>5} {'accept':>6} {'all-reduce us':>13} "
            f"{'verify ms':>9} {'cycle ms':>8} {'spec tok/s':>10} {'speedup':>7}",
        ]
        lines += [f"{row['steps']:>5} {row['topk']:>4} {row['draft_tokens']:>12} {row['batch']:>5} "
                  f"{row['accept']:>6.2f} {_us(row['allreduce_us']):>13} {row['verify_ms']:>9.2f} {row['cycle_ms']:>8.2f} "
                  f"{row['spec_tok_s']:>10.1f} {row['speedup']:>6.2f}x" for row in r["settings"]]
        batches = sorted({row["batch"] for row in r["settings"]})
        for b in batches:
            best = max((row for row in r["settings"] if row["batch"] == b), key=lambda row: row["spec_tok_s"])
            lines.append(("best: " if len(batches) == 1 else f"best at batch {b}: ") + f"steps {best['steps']}, topk {best['topk']}, draft tokens "
                         f"{best['draft_tokens']}, {best['spec_tok_s']:.1f} tok/s ({best['speedup']:.2f}x); "
                         + _serve_flags(best["steps"], best["topk"], best["draft_tokens"]))
    if r["batch_table"]:
        lines += [
            "",
            "batch: the same drafting with B sequences (tok/s of all of them; verify tokens and messages grow "
            "B-fold, " + ("each pass read from the measured pass table)" if c["pass_ms_by_tokens"] else  # the field unused
                          f"{c['verify_token_compute_us']:g} us of compute per layer per further token)"),
            f"{'batch':>5} {'verify ms':>9} {'decode ms':>9} {'base tok/s':>10} {'break-even':>10} | "
            + " ".join(f"{'A=' + a:>16}" for a in accepts),
        ]
        lines += [f"{row['batch']:>5} {row['verify_ms']:>9.2f} {row['decode_ms']:>9.2f} {row['baseline_tok_s']:>10.1f} "
                  f"{row['break_even_accept_len']:>10.2f} | "
                  + " ".join(f"{row['spec_tok_s'][a]:>8.1f} ({row['speedup'][a]:.2f}x)" for a in accepts)
                  for row in r["batch_table"]]
    return "\n".join(lines)


def _parenthesised(parts: list[str]) -> str:
    """' (a; b)' of the non-empty parts, '' without any."""
    parts = [p for p in parts if p]
    return f" ({'; '.join(parts)})" if parts else ""


def _first_draft(c: dict, r: dict) -> str:
    """How the draft line counts a cycle's first draft beside its steps."""
    if c["draft_extend_us_by_batch"]:
        return f"extend {us_text(r['first_draft_us'])} us + {c['steps'] - 1}"
    if r["first_draft_us"] != r["draft_step_us"]:  # a tree's first step, one row per sequence
        return f"{us_text(r['first_draft_us'])} us + {c['steps'] - 1}"
    return str(c["steps"])


def _percent(share: float) -> str:
    """A share as a whole percentage; one that rounds to 0 % keeps a significant figure, as it is not none."""
    whole = f"{100 * share:.0f}"
    return f"{whole} %" if whole != "0" else f"{100 * share:.1g} %"


def _us(x: float | None) -> str:
    return "-" if x is None else us_text(x)


def _serve_flags(steps: int, topk: int, draft_tokens: int) -> str:
    """The settings as SGLang (which counts the verified root among its draft tokens) and vLLM take them."""
    sglang = (f"in SGLang --speculative-num-steps {steps} --speculative-eagle-topk {topk} "
              f"--speculative-num-draft-tokens {draft_tokens + 1}")
    return sglang + (f", in vLLM num_speculative_tokens {steps}" if topk == 1 else "")
