"""`eval` over several speculative settings, as SGLang's bench_speculative sweeps them: which to serve?

`eval --steps 2,4,6 --topk 1,2 --draft-tokens 8,12 --batch 1,8` decodes the prompts once per setting
(each with its own target-only run at the same batch, so every ratio compares like with like) and
prints one row per setting. Speculation's gain shrinks as the batch grows: a verify pass carries
batch x (draft tokens + 1) tokens, and a larger batch decodes plainly at a better price per token.
A chain (topk 1) verifies its S drafts, so the draft-token list applies to trees only (a list
given with chains alone is refused); a tree setting that cannot select that many tokens is left
out with a line that says so.
`costmodel --inputs SWEEP.json` prices every row on a deployment and names the best one.

Each setting's result is journaled as it finishes (`SWEEP.json.partial`): a killed sweep run
again decodes only the settings it has not finished, and a longer list reuses those it shares.
A served eval sweeps its requests in flight and their arrival rate the same way (`eval --server URL
--concurrency 1,4,16 --request-rate 2,8`).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from drafter_lab.errors import LabError
from drafter_lab.journal import Journal
from drafter_lab.progress import log
from drafter_lab.spec.costinputs import batch_of
from drafter_lab.spec.engine import SpecConfig


def grid(steps: list[int], topks: list[int], draft_tokens: list[int] | None, batches: list[int] = (1,)) -> list[dict]:
    """The (steps, topk, draft_tokens, batch) settings to decode, in the order given, duplicates dropped."""
    if any(b < 1 for b in batches):
        raise LabError(f"batch must be >= 1, got {','.join(map(str, batches))}")
    # a value given twice (--steps 2,2) made one setting a sweep: its refusal became "no setting of the
    # sweep can be drafted", after a "leaving out" line per copy
    steps, topks = list(dict.fromkeys(steps)), list(dict.fromkeys(topks))
    draft_tokens = None if draft_tokens is None else list(dict.fromkeys(draft_tokens))
    if draft_tokens and max(topks) == 1 and len({*steps, *draft_tokens}) > 1:
        # a chain's rows would drop the list and decode as if it was not given (SGLang: a warning, then S + 1)
        s = " or ".join(map(str, steps))
        sglang = f"{steps[0] + 1}" if len(steps) == 1 else "steps + 1"
        raise LabError(f"a chain verifies the {s} tokens it drafts, its --steps (SGLang's --speculative-num-draft-"
                       f"tokens {sglang}, the root included): --draft-tokens {','.join(map(str, draft_tokens))} "
                       "applies to a tree (--topk > 1)")
    sweep = len(steps) * len(topks) * len(draft_tokens or [None]) > 1
    out: list[dict] = []
    for s in steps:
        for k in topks:
            for t in draft_tokens or [None]:
                t = None if sweep and k == 1 else t
                try:
                    cfg = SpecConfig(steps=s, topk=k, draft_tokens=t)
                except LabError as e:
                    if not sweep:
                        raise
                    log(f"sweep: leaving out steps {s}, topk {k}, draft tokens {t}: {e}")
                    continue
                for b in batches:
                    setting = {"steps": s, "topk": k, "draft_tokens": cfg.tree_tokens, "batch": b}
                    if setting not in out:
                        out.append(setting)
    if not out:
        raise LabError("no setting of the sweep can be drafted")
    return out


def run_sweep(settings: list[dict], decode: Callable[[dict], dict], journal: Journal | None = None,
              check: Callable[[dict], None] | None = None) -> list[dict]:
    """decode(setting) for every setting, in order; those the journal holds are not decoded again.
    check(setting), which raises for a setting its decode would refuse, runs on every one before the first
    decodes: `--steps 4,5000` decoded steps 4 for minutes, then refused 5000 as past the target's positions."""
    def key(setting: dict) -> str:
        return json.dumps(setting, sort_keys=True)

    try:
        done = {key(r["setting"]): r["result"] for r in journal.records} if journal else {}
    except (KeyError, TypeError):  # a line edited by hand, or a journal of another command
        raise LabError("holds a line that is no sweep record (a setting and its result): delete the file to "
                       "start over", journal.path) from None
    todo = [s for s in settings if key(s) not in done]
    if check:
        for s in todo:
            check(s)
    if done:
        log(f"sweep: {len(settings) - len(todo)} of {len(settings)} settings already decoded ({journal.path})")
    for s in todo:
        done[key(s)] = decode(s)
        if journal:
            journal.append({"setting": s, "result": done[key(s)]})
    return [done[key(s)] for s in settings]


def format_sweep(results: list[dict]) -> str:
    """One row per setting: served accept length, the tok/s of that setting's own run and how much
    faster its median request's time per output token is."""
    rates = any(r["config"].get("request_rate") is not None for r in results)  # a served sweep's arrivals
    head = f"{'steps':>5} {'topk':>4} {'draft tokens':>12} {'batch':>5}{' req/s' if rates else ''} | " \
           f"{'served accept':>13} {'spec tok/s':>10} {'target tok/s':>12} {'ratio':>6} {'TPOT ratio':>10}"
    lines = [head, "-" * len(head)]
    for r in results:
        c = r["config"]
        tpot = r.get("latency", {}).get("tpot_speedup")
        rate = f" {_cell(c.get('request_rate'), 'g'):>5}" if rates else ""
        lines.append(f"{_cell(c['steps']):>5} {_cell(c['topk']):>4} {_cell(c['draft_tokens']):>12} {batch_of(r):>5}{rate} | "
                     f"{_cell(r['served_accept_len'], '.3f'):>13} {_cell(r['spec_tok_s'], '.1f'):>10} "
                     f"{_cell(r.get('baseline_tok_s'), '.1f'):>12} "
                     f"{_cell(r.get('speedup'), '.2f') + ('x' if r.get('speedup') is not None else ''):>6} "
                     f"{_cell(tpot, '.2f') + ('x' if tpot else ''):>10}")
    if not all("speedup" in r for r in results):
        return "\n".join(lines + ["(no target-only tok/s: pass --baseline-server for the ratio)"])
    drafting = {(r["config"]["steps"], r["config"]["topk"], r["config"]["draft_tokens"]) for r in results}
    batches = sorted({batch_of(r) for r in results}) if len(drafting) > 1 else []  # else nothing to choose
    for b in batches:
        # a null ratio (a NaN the journal or JSON kept as null) is no candidate: None > float raised
        priced = [r for r in results if batch_of(r) == b and r["speedup"] is not None]
        if not priced:
            continue
        best = max(priced, key=lambda r: r["speedup"])["config"]
        lines.append(f"fastest here{'' if len(batches) == 1 else f' at batch {b}'}: steps {best['steps']}, "
                     f"topk {best['topk']}, draft tokens {best['draft_tokens']}")
    if "server" not in results[0]:  # a served sweep's speed is its server's
        lines.append("(this machine's speed; `costmodel --inputs` prices the settings on a deployment)")
    return "\n".join(lines)


def _cell(value, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)
