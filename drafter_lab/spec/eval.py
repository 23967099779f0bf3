"""`drafter-lab eval`: served accept length, tok/s with and without speculation, the lossless check.

Both decodes run in the same process over the same prompts with the same max_new_tokens, after a
warm-up of each. The static schedule decodes the prompts batch by batch, alternating (target-only,
then speculative), each batch until its last row ends; the continuous one decodes all of them with
`batch` rows in flight, a waiting prompt taking each finished row's place (as a server schedules
requests), once target-only and once speculative. The prompt of a conversation is everything
before its first assistant turn, rendered with the target's chat template plus the generation
prompt. Each decode's wall time is also split by phase (prefill, draft, verify, accept, extend;
`phases.PhaseClock`), which is where a cost model priced from measured parts (`bench verify`) and
the measured tok/s part ways, and each request is timed: its time to first token and its time per
output token after that (TTFT, TPOT; every prompt arrives when its decode starts).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time

import torch

from drafter_lab.data.chat import TemplateRefusal, render, rendered_with
from drafter_lab.errors import LabError
from drafter_lab.progress import progress
from drafter_lab.spec.accept import accept_summary
from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.spec.ngram import NgramDrafter
from drafter_lab.spec.pairing import check_pair
from drafter_lab.spec.phases import add as add_phases

WARMUP_TOKENS = 8


def render_prompts(tokenizer, conversations, where=None, template_kwargs: dict | None = None) -> list[list[int]]:
    """Token ids of each conversation's first prompt (turns before the first assistant turn; in one
    without an answer, as an eval prompt set such as MT-bench's, the turns through its first user turn,
    as its later questions follow an answer), rendered with the chat template's extra variables
    `template_kwargs` (chat.render)."""
    out = []
    for conv in conversations:
        roles = [m["role"] for m in conv.messages]
        if "assistant" in roles:
            head = conv.messages[: roles.index("assistant")]
        else:
            head = conv.messages[: roles.index("user") + 1] if "user" in roles else []
        if not any(m["role"] == "user" for m in head):
            before = " before its first assistant turn" if "assistant" in roles else ""
            raise LabError(f"conversation {conv.id} has no user turn{before}", where)
        try:
            text = render(tokenizer, head, True, template_kwargs, conv.tools)
        except TemplateRefusal as e:  # names neither the prompts file nor the conversation
            raise LabError(f"conversation {conv.id}: {e} (the chat template of {tokenizer.name_or_path})", where) from None
        out.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    if not out:
        raise LabError("no prompts to decode", where)
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def evaluate(
    target,
    drafter,
    conversations,
    *,
    steps: int = 4,
    topk: int = 1,
    draft_tokens: int | None = None,
    batch: int = 1,
    continuous: bool = False,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    seed: int = 0,
    use_fused: bool | None = None,
    template_kwargs: dict | None = None,
    where=None,
) -> dict:
    """Decode every conversation's prompt with and without the drafter; returns all the numbers.

    `drafter` is an EAGLE-3 drafter or an `NgramDrafter`. Greedy (temperature 0) outputs must be
    identical; a difference raises LabError naming the prompt and the first diverging generated
    position.
    """
    if batch < 1:
        raise LabError(f"batch must be >= 1, got {batch}")
    ngram = isinstance(drafter, NgramDrafter)
    if not ngram:
        check_pair(target, drafter, where)
    cfg = SpecConfig(steps=steps, topk=topk, draft_tokens=draft_tokens, temperature=temperature,
                     use_fused=use_fused, max_new_tokens=max_new_tokens)
    prompts = render_prompts(target.tokenizer, conversations, where, template_kwargs)
    engine = SpecEngine(target, drafter, cfg)
    engine.check_positions(prompts)  # every prompt's, before the warm-up and the first batch decode
    device = target.device
    batches = [prompts] if continuous else [prompts[i: i + batch] for i in range(0, len(prompts), batch)]
    slots = batch if continuous else None

    warm = SpecEngine(target, drafter, dataclasses.replace(cfg, max_new_tokens=min(WARMUP_TOKENS, max_new_tokens)))
    for speculative in (False, True):
        warm.generate(prompts[:batch], speculative=speculative, generator=torch.Generator(device).manual_seed(seed))
    if ngram:  # across prompts, the measurement must not look up the warm-up's rows
        drafter.forget()

    gens = {False: torch.Generator(device).manual_seed(seed), True: torch.Generator(device).manual_seed(seed)}
    outputs = {False: [], True: []}
    seconds = {False: 0.0, True: 0.0}
    accept: list[int] = []
    verify_passes, no_draft_passes, decode_passes = 0, 0, 0
    decode_rows = 0  # (row, pass)es of an unfinished row, target-only (speculative: one accept length each)
    requests = {False: {"ttft_ms": [], "tpot_ms": []}, True: {"ttft_ms": [], "tpot_ms": []}}
    phases: dict[bool, dict[str, float]] = {False: {}, True: {}}
    with progress("eval (target-only, speculative): prompts", total=2 * len(prompts)) as advance:
        for chunk in batches:
            for speculative in (False, True):
                _sync(device)
                t0 = time.perf_counter()
                g = engine.generate(chunk, speculative=speculative, generator=gens[speculative], slots=slots,
                                    on_finish=advance)
                _sync(device)
                _add_requests(requests[speculative], g, seconds[speculative])
                seconds[speculative] += time.perf_counter() - t0
                outputs[speculative].extend(g.tokens)
                phases[speculative] = add_phases(phases[speculative], g.phase_seconds)
                if not speculative:
                    decode_passes += g.verify_passes
                    decode_rows += len(g.accept_lengths)
                else:
                    accept.extend(g.accept_lengths)
                    verify_passes += g.verify_passes
                    no_draft_passes += g.no_draft_passes
                advance(0, accept=sum(accept) / max(len(accept), 1))

    if temperature == 0:
        for i, (a, b) in enumerate(zip(outputs[False], outputs[True])):
            j = first_difference(a, b)
            if j is not None:
                want = a[j] if j < len(a) else "end"
                got = b[j] if j < len(b) else "end"
                raise LabError(
                    f"lossless check failed: prompt {i} ({conversations[i].id}) differs at generated token {j}: "
                    f"target-only {want}, speculative {got}",
                    where,
                )
    if not accept:  # every prompt ended at its first token, which the prefill makes
        raise LabError("no verify step ran: every prompt ended at its first token; raise --max-new-tokens", where)
    tokens = {k: sum(len(o) for o in v) for k, v in outputs.items()}
    spec_tps = tokens[True] / seconds[True]
    base_tps = tokens[False] / seconds[False]
    summary = accept_summary(accept, cfg.max_accept)
    # An n-gram lookup is host work, the same on any deployment: its measured time per draft token
    # is a cost-model input (`costmodel --inputs`), and so is the share of verify passes it had
    # nothing to draft for in any row (a server decodes those plainly). A drafter's time here says
    # nothing about a GPU's.
    draft_seconds = phases[True].get("draft", 0.0)
    host_draft = {
        "draft_seconds": draft_seconds, "no_draft_share": no_draft_passes / max(verify_passes, 1),
        "draft_step_us": draft_step_us(draft_seconds, verify_passes - no_draft_passes, steps),
    } if ngram else {}
    return {
        "served_accept_len": summary["served_accept_len"],
        "accept_length_kind": "served: tokens emitted per verify step, bonus token included",
        "accept_histogram": summary["histogram"],
        "verify_steps": summary["verify_steps"],
        "verify_passes": verify_passes,
        "decode_passes": decode_passes,
        "spec_tok_s": spec_tps,
        "baseline_tok_s": base_tps,
        "speedup": spec_tps / base_tps,
        "spec_seconds": seconds[True],
        "baseline_seconds": seconds[False],
        "spec_tokens": tokens[True],
        "baseline_tokens": tokens[False],
        "phase_seconds": {"spec": phases[True], "baseline": phases[False]},
        "live_rows_per_pass": {"spec": len(accept) / max(verify_passes, 1),
                               "baseline": decode_rows / max(decode_passes, 1)},
        "requests": {"spec": requests[True], "baseline": requests[False]},
        "latency": latency(requests[True], requests[False]),
        "lossless_check": "identical" if temperature == 0 else "skipped: sampling (temperature > 0)",
        "prompts": len(prompts),
        "config": {
            "steps": steps, "topk": topk, "draft_tokens": cfg.tree_tokens, "batch": batch,
            "schedule": "continuous" if continuous else "static",
            "max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed,
            "drafting": "chain" if topk == 1 else "tree", "fused_draft_step": engine.fused,
            "drafter": drafter.cfg.describe() if ngram else "EAGLE-3",
            **rendered_with(target.tokenizer, template_kwargs),
        },
        **host_draft,
        "target": target.describe(),
        "device": str(device),
        "dtype": str(next(target.model.parameters()).dtype).removeprefix("torch."),
        "torch": torch.__version__,
    }


def add_request(into: dict[str, list[float]], ttft_s: float, decode_s: float, tokens: int) -> None:
    """One request's time to first token and, past one token, its time per output token after the
    first (`decode_s`: seconds from its first token to its last), in ms."""
    into["ttft_ms"].append(1e3 * ttft_s)
    if tokens > 1:
        into["tpot_ms"].append(1e3 * decode_s / (tokens - 1))


def _add_requests(into: dict[str, list[float]], g, before: float) -> None:
    """Every prompt of a decode, as if it arrived when its side's first decode started (`before`:
    that side's seconds so far)."""
    for tokens, first, last in zip(g.tokens, g.first_token_seconds, g.finish_seconds):
        add_request(into, before + first, last - first, len(tokens))


def latency(spec: dict[str, list[float]], baseline: dict[str, list[float]]) -> dict:
    """Median and p90 of each side's TTFT and TPOT, and how much faster the speculative median TPOT is."""
    def summary(values: list[float]) -> dict[str, float | None]:
        if not values:
            return {"median": None, "p90": None}
        ranked = sorted(values)
        return {"median": statistics.median(ranked), "p90": ranked[math.ceil(0.9 * len(ranked)) - 1]}  # nearest rank

    out = {side: {k: summary(reqs[k]) for k in ("ttft_ms", "tpot_ms")}
           for side, reqs in (("spec", spec), ("baseline", baseline))}
    s, b = out["spec"]["tpot_ms"]["median"], out["baseline"]["tpot_ms"]["median"]
    out["tpot_speedup"] = b / s if s and b else None
    return out


def draft_step_us(draft_seconds: float, drafted_passes: float, steps: int) -> float:
    """Host drafting time per draft token, over the passes that drafted: the cost model charges drafting
    on those alone, so the lookups that found nothing are spread over them (their time is still spent)."""
    return 1e6 * draft_seconds / max(drafted_passes * steps, 1)


def pool(sets: dict[str, dict]) -> dict:
    """One result over prompt sets evaluated apart (`eval --prompts A --prompts B`): the served accept
    length over all their verify steps (total tokens emitted / total verify steps), histograms
    summed, tok/s as all tokens over all seconds; each set's own result stays under "sets"."""
    rs = list(sets.values())
    out = dict(rs[0])  # the settings, which every set shares
    verify = sum(r["verify_steps"] for r in rs)
    out["served_accept_len"] = sum(r["served_accept_len"] * r["verify_steps"] for r in rs) / verify
    out["verify_steps"] = verify
    hists = [r["accept_histogram"] for r in rs]
    if any(h is None for h in hists):
        out["accept_histogram"] = None
    else:
        keys = sorted({k for h in hists for k in h}, key=int)
        out["accept_histogram"] = {k: sum(h.get(k, 0) for h in hists) for k in keys}
    for key in ("prompts", "verify_passes", "decode_passes", "draft_seconds"):
        if key in out:
            out[key] = sum(r[key] for r in rs)
    if "draft_step_us" in out:
        no_draft = round(sum(r["no_draft_share"] * r["verify_passes"] for r in rs))
        out["draft_step_us"] = draft_step_us(out["draft_seconds"], out["verify_passes"] - no_draft,
                                             out["config"]["steps"])
        out["no_draft_share"] = no_draft / out["verify_passes"]
    if "live_rows_per_pass" in out:
        out["live_rows_per_pass"] = {
            side: sum(r["live_rows_per_pass"][side] * r[passes] for r in rs) / max(out[passes], 1)
            for side, passes in (("spec", "verify_passes"), ("baseline", "decode_passes"))}
    if "requests" in out:
        out["requests"] = {side: {k: [x for r in rs for x in r["requests"][side][k]] for k in out["requests"][side]}
                           for side in ("spec", "baseline")}
        out["latency"] = latency(out["requests"]["spec"], out["requests"]["baseline"])
    if "in_flight" in out:  # a served eval's: each set's requests' seconds over all the wall seconds
        out["in_flight"] = {side: None if out["in_flight"][side] is None else
                            sum(r["in_flight"][side] * r[f"{side}_seconds"] for r in rs)
                            / sum(r[f"{side}_seconds"] for r in rs) for side in ("spec", "baseline")}
    if "phase_seconds" in out:
        out["phase_seconds"] = {side: functools.reduce(add_phases, (r["phase_seconds"][side] for r in rs), {})
                                for side in ("spec", "baseline")}
    for side in ("spec", "baseline"):
        if f"{side}_tokens" in out:
            tokens, seconds = (sum(r[f"{side}_{k}"] for r in rs) for k in ("tokens", "seconds"))
            out.update({f"{side}_tokens": tokens, f"{side}_seconds": seconds, f"{side}_tok_s": tokens / seconds})
    if "baseline_tok_s" in out:
        out["speedup"] = out["spec_tok_s"] / out["baseline_tok_s"]
    if "lossless_check" in out:
        checks = {name: r["lossless_check"] for name, r in sets.items()}
        same = len(set(checks.values())) == 1
        out["lossless_check"] = out["lossless_check"] if same else "; ".join(f"{n}: {c}" for n, c in checks.items())
    out["sets"] = sets
    return out
