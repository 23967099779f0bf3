"""Measured inputs of the cost model: benchmark and eval JSON files folded into a `CostModelConfig`.

A measured-inputs file (`--inputs FILE`, written by the kernel benchmarks) is a JSON object with
any of these keys (others are ignored, so a benchmark can write its full results beside them):

    "allreduce_us":  number, or {"<message bytes>": us, ...} (a verify message is
                     batch x verify_tokens x hidden_size x dtype_bytes; the latency is interpolated
                     in log-size, and beyond the largest size grows with it): the deployment's
                     all-reduce (the decode's too where faster) in every figure, unless
                     --verify-allreduce-us is given, and a "measured" what-if row; a `bench allreduce`
                     JSON keyed by backend is refused for the per-backend files written beside it
    "draft_step_us": number, replaces draft_step_us (and, without the next key, any table)
    "draft_step_us_by_batch": {"<batch>": us, ...}, the draft step at each measured batch
    "draft_extend_us_by_batch": {"<batch>": us, ...}, the drafter's pass over the accepted tokens
    "verify_ms":     number, a measured whole verify step (measured_verify_ms): the per-layer compute
                     is derived from it
    "verify_ms_by_tokens": {"<batch>": {"<tokens per row>": ms}}, one device's target passes
                     (`bench verify`): sets pass_ms_by_tokens
    "deployment":    {field: value} for num_layers, hidden_size, dtype_bytes, allreduces_per_layer,
                     cycle_overhead_ms and decode_overhead_ms: the deployment a benchmark measured
                     (`bench verify`: its target on one device, no host work)
    "decode_ms":     number, replaces decode_ms
    "no_draft_share": number in [0, 1), replaces no_draft_share (an n-gram eval writes it)
    "accept_length": number or list of numbers (served, so >= 1), added to the table's columns
    "accept_by_steps": list of numbers (>= 1), the served accept length with 1, 2, ... draft steps (chain),
                     at most MAX_DRAFT_STEPS of them

`drafter-lab eval --json` output is an inputs file too: its served accept length joins the columns,
its draft steps, draft tokens, batch (a served eval's requests in flight, `batch_of`) and topk set
`steps`, `verify_tokens`, `batch` and `topk` (the last eval's, given several), and a chain eval's (topk 1) accept histogram at S steps gives the served accept
length at every depth s <= S: a verify step that emitted n tokens at S (n - 1 drafts accepted) emits
min(n - 1, s) + 1 at s, since a chain's first s drafts do not depend on how many follow. From
these the draft-steps table finds the depth that maximises tok/s: more steps raise the accept
length, but each costs a draft step and one more verify token on the wire.

A `train` run directory (or its `best/`) stands for the accept lengths its validation predicts at
every depth, before any decode (`predicted_by_steps`): a greedy chain's, or with `sampled` a sampled
chain's at the run's `val_temperature` (its replay over the target's own tokens where the validation
has one).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

from drafter_lab import atomic
from drafter_lab.errors import LabError
from drafter_lab.progress import log
from drafter_lab.spec.costmodel import MAX_DRAFT_STEPS, CostModelConfig, Latency, finite
from drafter_lab.train.metrics_log import BEST_FILE, METRICS, read_metrics


def positive(value, key: str, path) -> float:
    """`value` as a float; a LabError naming `key` and the file unless it is a finite number > 0."""
    if not finite(value) or value <= 0:
        raise LabError(f"{key} must be a positive number, got {value!r}", path)
    return float(value)


def served_accept(value, key: str, path) -> float:
    """`positive`, and at least 1: a served accept length counts the bonus token."""
    a = positive(value, key, path)
    if a < 1:
        raise LabError(f"{key} must be at least 1 (a served accept length counts the bonus token), got {value!r}", path)
    return a


def accept_by_steps(histogram, path, steps: int | None = None) -> list[float]:
    """Served accept length at depths 1..S from a chain eval's accept histogram at S steps
    ({served length n: verify steps}, n = 1..S+1; see the module docstring), as deep as the longest
    length it lists less the bonus token (deeper adds nothing), and at least depth 1. A longer length than
    `steps` (else MAX_DRAFT_STEPS) allows is refused: it drove the table that deep (a huge one hung)."""
    try:
        counts = {_whole(n): c for n, c in histogram.items()}
    except (AttributeError, TypeError, ValueError):
        raise LabError("accept_histogram must map served accept lengths to counts", path) from None
    _no_twice(histogram, "accept_histogram", path)
    # int() cut 1.7 to 1; a negative one read as none
    if not all(finite(c) and c == int(c) and c >= 0 for c in counts.values()):
        raise LabError(f"accept_histogram counts must be whole numbers (>= 0) of verify steps, got {histogram!r}",
                       path)
    if counts and min(counts) < 1:
        raise LabError(f"accept_histogram holds a served accept length of {min(counts)}: each verify step emits at "
                       "least 1 token (the bonus one)", path)
    counts = {n: int(c) for n, c in counts.items()}
    total = sum(counts.values())
    if total <= 0:
        raise LabError("accept_histogram holds no verify steps", path)
    bound = (steps if steps is not None else MAX_DRAFT_STEPS) + 1
    if max(counts) > bound:
        limit = (f"config.steps + 1 = {bound} (the drafts and the bonus token)" if steps is not None
                 else f"{bound}: no engine drafts more than {MAX_DRAFT_STEPS} steps (+ the bonus token)")
        raise LabError(f"accept_histogram holds a served accept length of {max(counts)}, above {limit}", path)
    # no draft ever accepted ({1: n}) is accept 1.0 at every depth: a loss the table shows, where an
    # empty list dropped the table (and the study report's best depth was None). A length listed with no
    # steps counts: `eval` lists 1..steps+1, so the table reaches the depth the eval ran at.
    depths = max(max(counts) - 1, 1)
    return [sum(c * (min(n - 1, s) + 1) for n, c in counts.items()) / total for s in range(1, depths + 1)]


def predicted_by_steps(validation: dict, sampled: bool = False) -> list[float]:
    """Served accept length at depths 1..K that a validation predicts (chain): greedy, draft k is
    accepted when drafts 0..k all equal the target's top-1, which happens with probability
    prod_{j<=k} cond_acc_j, so s steps emit 1 + sum_{k<s} prod_{j<=k} cond_acc_j tokens per verify
    step (the bonus included; `simulated_accept_len` is that sum at s = K without it). `sampled`:
    replay_accept_len_k where the validation replayed a sampled server over the target's own tokens,
    else the same sum from sampled_acc_j, a sampled chain's acceptance at the validation's temperature.
    Teacher-forced, it predicts serving as well as the validation set resembles the served text."""
    out: list[float] = []
    if sampled and "replay_accept_len_0" in validation:
        while f"replay_accept_len_{len(out)}" in validation:
            out.append(validation[f"replay_accept_len_{len(out)}"])
        return out
    name = "sampled_acc" if sampled else "cond_acc"
    p = 1.0
    while f"{name}_{len(out)}" in validation:
        p *= validation[f"{name}_{len(out)}"]
        out.append((out[-1] if out else 1.0) + p)
    return out


PREDICTORS = {"cond_acc_": (0.0, 1.0), "sampled_acc_": (0.0, 1.0), "replay_accept_len_": (0.0, math.inf)}
"""The validation metrics `predicted_by_steps` reads, by name prefix, and their range."""


def _check_predictors(val: dict, step, path: Path) -> None:
    """Refuse a validation whose predictors are no numbers in range (a hand-edited or foreign file): text
    in one raised a TypeError, and a null one was priced as NaN after the prediction's log line."""
    for key, value in val.items():
        lo, hi = next((b for prefix, b in PREDICTORS.items() if key.startswith(prefix)), (None, None))
        if lo is None:
            continue
        if not finite(value) or not lo <= value <= hi:
            shown = "NaN (or null)" if isinstance(value, float) and math.isnan(value) else json.dumps(value)
            span = f"in [{lo:g}, {hi:g}]" if math.isfinite(hi) else f">= {lo:g}"
            raise LabError(f"its validation at step {step} has {key} {shown}, not a finite number {span}", path)


def run_inputs(path: Path, sampled: bool = False) -> dict:
    """`predicted_by_steps` of a training run: a run directory's last validation, or the kept one of
    its best/ (`train --keep-best`)."""
    if (path / BEST_FILE).exists():
        best = atomic.read_json(path / BEST_FILE, "")
        val = best.get("validation") if isinstance(best, dict) else None
        if not isinstance(val, dict):
            raise LabError(f"{BEST_FILE} holds no validation: nothing to predict accept lengths from", path)
        step = best.get("step", "?")  # its validation dict is the metrics alone
        source = path / BEST_FILE
    elif (path / METRICS).exists():
        rows = [r for r in read_metrics(path) if r.get("split") == "val"]
        if not rows:
            raise LabError("the run has not validated yet: nothing to predict accept lengths from", path)
        val = rows[-1]
        step = val.get("step", "?")
        source = path / METRICS
    else:
        raise LabError(f"neither a training run ({METRICS}) nor its best drafter ({BEST_FILE}): "
                       "no validation to predict accept lengths from", path)
    _check_predictors(val, step, source)
    if val.get("positions") == 0:  # its accuracies read 0.0: priced as a drafter that never hits
        raise LabError(f"its validation at step {step} scored no position (no val sequence has an "
                       "assistant token past its first two within max_length): nothing to predict accept lengths "
                       "from", path)
    by_steps = predicted_by_steps(val, sampled)
    if not by_steps:
        missing = ("sampled_acc_k: train with --val-temperature T to predict a sampled chain" if sampled
                   else "cond_acc_k: nothing to predict accept lengths from")
        raise LabError(f"its validation has no {missing}", path)
    if short := [k for k, a in enumerate(by_steps) if a < 1]:  # a replay's (greedy ones start at 1)
        k = short[0]
        raise LabError(f"its validation at step {step} has replay_accept_len_{k} {by_steps[k]:g}, below 1 "
                       "(train writes 0 where the replay ran no verify step at that depth): no accept length "
                       "to price", source)
    chain = ("sampled chain, replayed over the target's own tokens" if sampled and "replay_accept_len_0" in val
             else "sampled chain" if sampled else "greedy chain")
    log(f"{path}: served accept lengths predicted from the validation at step {step} "
        f"(teacher-forced, {chain}): {', '.join(f'{a:.2f}' for a in by_steps)} at 1..{len(by_steps)} steps")
    return {"accept_by_steps": by_steps}


MEASURED_ACCEPT = ("served_accept_len", "accept_histogram", "accept_by_steps")
"""Inputs that measure one drafter's accept lengths (an eval, a run's prediction): one cost model takes one."""
KNOWN_INPUTS = ("allreduce_us", "draft_step_us", "draft_step_us_by_batch", "draft_extend_us_by_batch", "verify_ms",
                "verify_ms_by_tokens", "deployment", "decode_ms", "no_draft_share", "accept_length", *MEASURED_ACCEPT)
DEPLOYMENT_FIELDS = ("num_layers", "hidden_size", "dtype_bytes", "allreduces_per_layer", "cycle_overhead_ms",
                     "decode_overhead_ms")
OVERHEADS = ("cycle_overhead_ms", "decode_overhead_ms")


def read_inputs(path, sampled: bool = False) -> dict:
    """A measured-inputs JSON: an object with any of KNOWN_INPUTS, or an eval sweep's {"sweep": [eval, ...]}
    alone; or a training run's directory (`run_inputs`, greedy or `sampled`)."""
    path = Path(path)
    if path.is_dir():
        return run_inputs(path, sampled)
    data = atomic.read_json(path, "cost model inputs file not found")
    if isinstance(data, dict) and "sweep" in data:
        if others := sorted(set(data) - {"sweep"}):  # each row is priced on its own: the others were dropped
            raise LabError(f"holds \"sweep\" (an eval sweep's rows) beside {', '.join(others)}: an `eval` "
                           "sweep's JSON holds \"sweep\" alone; give the other inputs in a file of their own",
                           path)
        rows = data["sweep"]
        if not (isinstance(rows, list) and rows and all(isinstance(r, dict) and "served_accept_len" in r
                                                        and isinstance(r.get("config"), dict)
                                                        and isinstance(r["config"].get("steps"), int)
                                                        for r in rows)):
            raise LabError("sweep must be a list of `eval --json` results (served_accept_len, config.steps)", path)
        for r in rows:
            _eval_config(r, path)  # before batch_of reads its batch: "x" raised a ValueError
            batch_of(r, path)
        return data
    if isinstance(data, dict) and (isinstance(data.get("verify_ms"), dict) or (
            isinstance(data.get("allreduce_us"), dict) and any(isinstance(v, dict) for v in data["allreduce_us"].values()))):
        beside = sorted(str(p) for p in path.parent.glob(f"{path.stem}.costmodel-*.json"))
        raise LabError("a `bench allreduce` result, its timings by backend: pass one backend's file written beside it "
                       "instead: " + (" or ".join(beside) or f"{path.stem}.costmodel-<backend>.json (none there)"), path)
    if not isinstance(data, dict) or not any(k in data for k in KNOWN_INPUTS):
        raise LabError(f"no cost model inputs: expected a JSON object with any of {', '.join(KNOWN_INPUTS)}", path)
    return data


def drafting(cfg: CostModelConfig, data: dict, path) -> CostModelConfig:
    """`cfg` with what an input says about drafting: a benchmark's draft step (by batch), an eval's
    steps, verified tokens and batch (the settings its accept length is priced at), and an n-gram
    lookup's host time and no-match share."""
    over: dict = {}
    if "draft_step_us" in data:
        over["draft_step_us"] = positive(data["draft_step_us"], "draft_step_us", path)
        if "draft_step_us_by_batch" not in data:  # a lone step (an n-gram lookup's) replaces the tables; beside
            over.update(draft_step_us_by_batch={}, draft_extend_us_by_batch={})  # a table, an earlier file's stay
    for key in ("draft_step_us_by_batch", "draft_extend_us_by_batch"):
        if key in data:
            over[key] = _batch_table(data[key], key, path)
    if "no_draft_share" in data:
        z = data["no_draft_share"]
        if isinstance(z, bool) or not isinstance(z, (int, float)) or not 0 <= z < 1:
            raise LabError(f"no_draft_share must be a number in [0, 1), got {z!r}", path)
        over["no_draft_share"] = float(z)
    conf = _eval_config(data, path)
    if "served_accept_len" in data and conf:  # an eval's batch, even from a server that did not say its steps
        over["batch"] = batch_of(data, path)
    if "served_accept_len" in data and conf.get("steps") is not None:
        over["steps"] = conf["steps"]
        over["topk"] = conf.get("topk") or 1
        over["verify_tokens"] = (conf.get("draft_tokens") or conf["steps"]) + 1
    return dataclasses.replace(cfg, **over)


def _eval_config(data: dict, path) -> dict:
    """An input's eval settings (`config`, {} without one), each that prices its accept length a
    positive integer, and its request rate (`batch_of`'s switch) a positive number."""
    conf = {} if data.get("config") is None else data["config"]  # `or {}` took [], 0 and "" for none
    if not isinstance(conf, dict):
        raise LabError(f"config must be an object (an eval's settings), got {conf!r}", path)
    for key in ("steps", "topk", "draft_tokens", "batch", "concurrency"):  # what prices the accept length
        value = conf.get(key)
        if value is not None and (not isinstance(value, int) or not finite(value) or value < 1):
            raise LabError(f"config.{key} must be a positive integer, got {value!r}", path)
    rate = conf.get("request_rate")  # `eval` runs at none but a positive one: 0, -1, NaN or "x" priced as one
    if rate is not None and (not finite(rate) or rate <= 0):
        raise LabError(f"config.request_rate must be a positive number of requests per second, got {rate!r}", path)
    return conf


def batch_of(result: dict, path=None) -> int:
    """Sequences an eval decoded together: the lab's batch, or a served eval's requests in flight (at
    a request rate, the mean the speculative server carried)."""
    c = result["config"]
    if c.get("request_rate") is not None:
        in_flight = result.get("in_flight")
        spec = in_flight.get("spec") if isinstance(in_flight, dict) else None
        if not finite(spec) or spec <= 0:
            raise LabError("a served eval at a request rate needs in_flight.spec, the requests it carried "
                           f"(a positive number), got {spec!r}", path)
        return max(1, round(spec))
    return int(c.get("batch") or c.get("concurrency") or 1)


def _whole(key) -> int:
    """A table key as a whole number, JSON's "8" or a Python caller's 8; any other is a ValueError, as int("1.5")
    raises (int() read a caller's 1.5 and True as 1, and "1_6" as 16)."""
    if isinstance(key, bool) or not (isinstance(key, int) or isinstance(key, str) and re.fullmatch(r"-?[0-9]+", key)):
        raise ValueError(f"no whole number: {key!r}")
    return int(key)


def _cut(key, quoted: bool = False) -> str:
    """A key as a message shows it (`quoted`: its repr, whose quotes show a string's spaces), a long one (a
    4300-digit batch) cut to its ends, where it was printed whole."""
    text = repr(key) if quoted else str(key)
    return text if len(text) <= 24 else f"{text[:10]}...{text[-6:]} ({len(str(key))} characters)"


def _no_twice(table: dict, name: str, path) -> None:
    """Refuse two keys of `table` (whole numbers, `_whole`) that read as one number: "8" beside "08" silently
    replaced the other's value."""
    seen: dict = {}
    for key in table:
        if (n := _whole(key)) in seen:
            raise LabError(f"{name} has keys {_cut(seen[n], True)} and {_cut(key, True)}, both {_cut(n)}: "
                           "one would silently replace the other", path)
        seen[n] = key


def _batch_table(table, key: str, path) -> dict[int, float]:
    if not isinstance(table, dict):
        raise LabError(f"{key} must map batch sizes to microseconds", path)
    out = {}
    for b, us in table.items():
        try:
            batch = _whole(b)
        except ValueError:
            raise LabError(f"{key} must map batch sizes to microseconds: batch {_cut(b, True)} is no whole number of "
                           "sequences", path) from None
        out[batch] = positive(us, f"{key}[{_cut(b)}]", path)
    if not out or min(out) < 1 or not finite(max(out)):  # float() of a 400-digit batch overflowed when read
        raise LabError(f"{key} must map batch sizes (>= 1) to microseconds", path)
    _no_twice(table, key, path)
    return out


def apply_inputs(cfg: CostModelConfig, path) -> tuple[CostModelConfig, Latency | None]:
    """Fold a measured-inputs file into `cfg` (see `fold`)."""
    return fold(cfg, read_inputs(path), path)


def fold(cfg: CostModelConfig, data: dict, path) -> tuple[CostModelConfig, Latency | None]:
    """Fold measured inputs (a benchmark's or an eval's) into `cfg`; returns (config, measured
    all-reduce latency or None)."""
    cfg = _deployment(cfg, data.get("deployment"), path)
    cfg = drafting(cfg, data, path)
    over: dict = {}
    if "decode_ms" in data:
        over["decode_ms"] = positive(data["decode_ms"], "decode_ms", path)
    extra = []
    if "accept_length" in data:
        extra = data["accept_length"] if isinstance(data["accept_length"], list) else [data["accept_length"]]
        if not extra:  # a file holding only this priced the preset's columns as if it had measured them
            raise LabError("accept_length must be a served accept length or a list of them, got []", path)
        extra = [served_accept(a, "accept_length", path) for a in extra]
    if "served_accept_len" in data:
        extra.append(round(served_accept(data["served_accept_len"], "served_accept_len", path), 2))
    if extra:
        over["accept_lengths"] = sorted(set(cfg.accept_lengths) | set(extra))
    if "accept_by_steps" in data:
        given = data["accept_by_steps"]
        if not isinstance(given, list) or not given:
            raise LabError(f"accept_by_steps must be a list of served accept lengths, got {given!r}", path)
        if len(given) > MAX_DRAFT_STEPS:  # the draft-steps table priced each depth, again per what-if row
            raise LabError(f"accept_by_steps lists {len(given)} depths, above the {MAX_DRAFT_STEPS} draft "
                           "steps any engine drafts", path)
        over["accept_by_steps"] = [served_accept(a, f"accept_by_steps[{i}]", path) for i, a in enumerate(given)]
    if data.get("accept_histogram") is not None and "accept_by_steps" not in data:  # a list given is what was meant
        conf = data.get("config") or {}  # an object: `drafting` checked it
        topk = conf.get("topk", 1)
        if topk == 1:
            over["accept_by_steps"] = accept_by_steps(data["accept_histogram"], path, conf.get("steps"))
        else:  # a tree's depths share nodes: its histogram says nothing about shallower trees
            what = "drafting of unknown topk" if topk is None else f"tree drafting (topk {topk})"
            log(f"{path}: its accept histogram comes from {what}; the draft-steps table needs a chain (topk 1)")
    cfg = dataclasses.replace(cfg, **over)
    if "verify_ms_by_tokens" in data:
        cfg = dataclasses.replace(cfg, pass_ms_by_tokens=_pass_table(data["verify_ms_by_tokens"], path))
    if "verify_ms" in data:  # its compute is derived once the deployment is whole (CostModel)
        cfg = dataclasses.replace(cfg, measured_verify_ms=positive(data["verify_ms"], "verify_ms", path),
                                  verify_compute_tokens=cfg.verify_tokens)
    measured = None
    if "allreduce_us" in data:
        ar = data["allreduce_us"]
        if isinstance(ar, dict):
            try:
                sizes = {_whole(k): us for k, us in ar.items()}
                _no_twice(ar, "allreduce_us table", path)
            except ValueError:
                sizes = {0: None}
            if not sizes:
                raise LabError("allreduce_us table is empty", path)
            if min(sizes) < 1:
                raise LabError("allreduce_us table keys must be message sizes in bytes (>= 1)", path)
            measured = {k: positive(us, f"allreduce_us[{_cut(k)}]", path) for k, us in sizes.items()}
        else:
            measured = positive(ar, "allreduce_us", path)
    return cfg, measured


def _deployment(cfg: CostModelConfig, given, path) -> CostModelConfig:
    if given is None:
        return cfg
    if not isinstance(given, dict) or not set(given) <= set(DEPLOYMENT_FIELDS):
        raise LabError(f"deployment must be an object with some of {', '.join(DEPLOYMENT_FIELDS)}", path)
    over = {}
    for key, value in given.items():
        if key in OVERHEADS and value == 0 and not isinstance(value, bool):
            over[key] = value
        elif key in OVERHEADS:
            over[key] = positive(value, f"deployment.{key}", path)
        # the all-reduces are a count too: 0.0 passed as 0, and the cost model carried a float count on
        elif isinstance(value, int) and finite(value) and value >= (0 if key == "allreduces_per_layer" else 1):
            over[key] = value
        else:
            zero = " or 0 (one device)" if key == "allreduces_per_layer" else ""
            raise LabError(f"deployment.{key} must be a positive integer{zero}, got {value!r}", path)
    return dataclasses.replace(cfg, **over)


def _pass_table(table, path) -> dict[int, dict[int, float]]:
    try:
        out = {_whole(b): {_whole(t): positive(ms, f"verify_ms_by_tokens[{_cut(b)}][{_cut(t)}]", path)
                           for t, ms in row.items()} for b, row in table.items()}
    except (AttributeError, ValueError):
        raise LabError("verify_ms_by_tokens must map batch sizes to {tokens per row: ms}", path) from None
    tokens = [t for row in out.values() for t in row]
    if (not out or not all(out.values()) or min(out) < 1 or min(tokens) < 1
            or not finite(max([*out, *tokens]))):  # float() of a 400-digit key overflowed when read
        raise LabError("verify_ms_by_tokens must map batch sizes (>= 1) to {tokens per row (>= 1): ms}", path)
    _no_twice(table, "verify_ms_by_tokens", path)
    for b, row in table.items():
        _no_twice(row, f"verify_ms_by_tokens[{_cut(b)}]", path)
    return out
