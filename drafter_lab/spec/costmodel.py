"""Verify-step cost model: what a faster all-reduce or a better drafter buys, in tok/s.

One speculative cycle drafts `steps` tokens, verifies them in one target pass and emits A tokens
(A = served accept length, bonus included):

    verify_ms  = num_layers x verify_layer_compute_us + n_allreduce x allreduce_us
    cycle_ms   = steps x draft_step_us + verify_ms + cycle_overhead_ms
    spec tok/s = 1000 x A / ((1 - z) x cycle_ms + z x decode_ms)
    baseline   = 1000 / decode_ms,   decode_ms = decode compute + n_allreduce x decode_allreduce_us
                                                 + decode_overhead_ms
    break-even A = ((1 - z) x cycle_ms + z x decode_ms) / decode_ms

with n_allreduce = num_layers x allreduces_per_layer (tensor parallel: one after attention, one
after the MLP), and z = no_draft_share, the share of cycles with nothing to draft (n-gram lookup
without a match), which run as plain decode steps (0 for a drafter). A counts those cycles' one
token too. In the what-if tables an all-reduce latency x replaces the verify's, and the decode's
too where x is faster than decode_allreduce_us (a better all-reduce would serve plain decoding as
well), so the ratio compares like with like. A measured latency table is read at each pass's own
message size: verify_tokens x hidden x dtype bytes for a verify, one token's for a decode step
(times the batch, below).

Batching (`batch` B sequences decoded together, SGLang's concurrency): every field above is one
sequence's, and a batch scales them. A verify pass carries B x verify_tokens tokens and a decode
step B tokens: each token beyond one sequence's adds verify_token_compute_us of compute per layer
(0: flat, as memory-bound dense layers are; an MoE reads more experts), messages are B times
larger, and the draft step is read from a measured {batch: us} table (a draft-forward benchmark's)
at batch x topk rows (a tree drafts topk children per row) when there is one, else it stays flat. Both tok/s count all B sequences:

    spec tok/s = 1000 x B x A / mean cycle,   baseline = 1000 x B / decode_ms(B)

so a verify that grows faster than the decode step (per-token compute, larger all-reduces) eats
the gain as B grows; `batches` prints the break-even accept length and tok/s at each.

The preset `seeds-kimi-k2.5-8x-pcie` is the seeds' deployment (Kimi-K2.5, 61 layers, 8 PCIe
GPUs, tensor parallel): 82 tok/s without speculation, verify ~30 ms of which ~25 ms is 122
all-reduces of ~205 us, draft ~0.66 ms per cycle; served accept 2.0 gave ~60 tok/s and 1.5 gave
~52 tok/s. Plain decoding at 82 tok/s with the verify's per-layer compute (5.0 ms) leaves
59 us per decode all-reduce (the decode step's messages are 4x smaller). The two seed points imply 33.3 and 28.8 ms per cycle: no fixed cycle time matches both,
so the preset's overhead (0.43 ms) splits the difference, giving 64 and 48 tok/s (+-7 %).

Measured inputs (`--inputs FILE`, written by the kernel benchmarks) are a JSON object with any
of these keys (others are ignored, so a benchmark can write its full results beside them):

    "allreduce_us":  number, or {"<message bytes>": us, ...} (a verify message is
                     batch x verify_tokens x hidden_size x dtype_bytes; the latency is interpolated
                     in log-size, and beyond the largest size grows with it); added to the what-if
                     tables as a "measured" row
    "draft_step_us": number, replaces draft_step_us (and, without the next key, any table)
    "draft_step_us_by_batch": {"<batch>": us, ...}, the draft step at each measured batch
    "draft_extend_us_by_batch": {"<batch>": us, ...}, the drafter's pass over the accepted tokens
    "verify_ms":     number, a measured whole verify step: the per-layer compute is derived from it
    "verify_ms_by_tokens": {"<batch>": {"<tokens per row>": ms}}, one device's target passes
                     (`bench verify`): sets pass_ms_by_tokens
    "deployment":    {field: value} for num_layers, hidden_size, dtype_bytes, allreduces_per_layer,
                     cycle_overhead_ms and decode_overhead_ms: the deployment a benchmark measured
                     (`bench verify`: its target on one device, no host work)
    "decode_ms":     number, replaces decode_ms
    "no_draft_share": number in [0, 1), replaces no_draft_share (an n-gram eval writes it)
    "accept_length": number or list of numbers (served), added to the table's columns

`drafter-lab eval --json` output is an inputs file too: its served accept length joins the columns,
its draft steps, draft tokens, batch and topk set `steps`, `verify_tokens`, `batch` and `topk` (the
last eval's, given several), and a chain eval's (topk 1) accept histogram at S steps gives the served accept
length at every depth s <= S: a verify step that emitted n tokens at S (n - 1 drafts accepted) emits
min(n - 1, s) + 1 at s, since a chain's first s drafts do not depend on how many follow. From
these the draft-steps table finds the depth that maximises tok/s: more steps raise the accept
length, but each costs a draft step and one more verify token on the wire.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from drafter_lab import atomic
from drafter_lab.errors import LabError
from drafter_lab.progress import log


@dataclass
class CostModelConfig:
    """Inputs of the verify-step cost model (times per cycle or per step, one sequence)."""

    num_layers: int = 61
    """Target decoder layers."""
    allreduces_per_layer: int = 2
    """Tensor-parallel all-reduces per layer (attention output + MLP/MoE output)."""
    verify_layer_compute_us: float = 82.0
    """Compute of one layer in the verify pass (everything but all-reduces) of `verify_tokens`
    tokens, microseconds."""
    verify_allreduce_us: float = 205.0
    """Latency of one all-reduce inside the verify pass, microseconds."""
    decode_ms: float = 1000.0 / 82.0
    """Measured plain decode step (one token) without speculation, milliseconds."""
    decode_allreduce_us: float = 59.0
    """Latency of one all-reduce inside a plain decode step, microseconds (the rest of decode_ms
    is compute)."""
    draft_step_us: float = 220.0
    """One drafter forward (draft step), microseconds."""
    steps: int = 3
    """Draft steps per cycle."""
    cycle_overhead_ms: float = 0.43
    """Per-cycle host work outside draft and verify (scheduling, sampling, cache bookkeeping)."""
    decode_overhead_ms: float = 0.0
    """Per-step host work of plain decoding outside the target pass (sampling, scheduling). 0 where
    decode_ms is a whole measured step (the preset's); with passes measured apart (`bench verify`),
    what a plain step adds to its pass (an eval's target-only accept phase is that on its machine)."""
    hidden_size: int = 7168
    """Target hidden size: sets the verify all-reduce message size."""
    dtype_bytes: int = 2
    """Bytes per activation element on the wire (bf16 = 2)."""
    verify_tokens: int = 4
    """Tokens in one verify pass (draft tokens + the root)."""
    verify_token_compute_us: float = 0.0
    """Verify compute per layer that each further verified token adds, microseconds: 0 keeps it
    flat, as for memory-bound dense layers; an MoE layer reads more experts as tokens grow. The
    draft-steps and settings tables move verify_layer_compute_us by this much per token."""
    accept_lengths: list[float] = field(default_factory=lambda: [1.5, 2.0, 2.5, 3.0, 3.5, 4.0])
    """Served accept lengths (bonus included) for the what-if tables."""
    whatif_allreduce_us: list[float] = field(default_factory=lambda: [200.0, 40.0, 25.0, 15.0, 8.0])
    """All-reduce latencies (us) for the what-if tables."""
    no_draft_share: float = 0.0
    """Share of cycles that draft nothing (n-gram lookup finding no match in any row of the batch):
    they run as a plain decode step, not a verify. `--inputs` takes it from an n-gram eval."""
    batch: int = 1
    """Sequences decoded together (concurrency): a verify pass carries batch x verify_tokens tokens,
    a decode step batch tokens, and tok/s counts every sequence's. `--inputs` takes an eval's."""
    draft_step_us_by_batch: dict[int, float] = field(default_factory=dict)
    """Measured draft step (us) by batch, from a draft-forward benchmark (`--inputs`): a batch's draft
    step is interpolated in it (linearly; beyond the largest, the last segment extended). Empty: the
    draft step is draft_step_us at every batch."""
    batches: list[int] = field(default_factory=list)
    """Batch sizes for the batch table: break-even accept length and tok/s at each (empty: no table)."""
    pass_ms_by_tokens: dict[int, dict[int, float]] = field(default_factory=dict)
    """Measured target passes on one device, {batch: {tokens per row: ms}} (`bench verify`): when
    given, a verify's compute is read from it at (batch, verify_tokens) and a decode step's at
    (batch, 1), linearly in tokens then in batch (beyond the measured ones, the last segment
    extended), in place of the per-layer compute fields and decode_ms."""
    draft_extend_us_by_batch: dict[int, float] = field(default_factory=dict)
    """Measured draft extend (us) by batch (`bench verify --drafter`): after a verify the drafter runs
    once over each row's accepted tokens, and that pass yields the first draft step's tokens, so a
    cycle drafts extend + (steps - 1) steps (as SGLang's EAGLE worker does). Empty: the extend costs
    one draft step (steps x draft step, as the preset was calibrated)."""
    topk: int = 1
    """Children per expanded node (tree drafting): a draft step runs batch x topk drafter rows, so
    draft_step_us_by_batch is read at that many. `--inputs` takes an eval's."""
    accept_by_steps: list[float] = field(default_factory=list)
    """Served accept length with 1, 2, ... draft steps (chain drafting); given, the draft-steps table
    picks the depth that maximises tok/s. `--inputs` derives it from an eval's accept histogram."""


PRESETS = {
    "seeds-kimi-k2.5-8x-pcie": CostModelConfig(),
}


class CostModel:
    def __init__(self, cfg: CostModelConfig):
        self.cfg = cfg
        if not 0 <= cfg.no_draft_share < 1:
            raise LabError(f"no_draft_share must be in [0, 1), got {cfg.no_draft_share}")
        if cfg.batch < 1 or any(b < 1 for b in cfg.batches) or cfg.topk < 1:
            raise LabError(f"batch sizes and topk must be >= 1, got batch {cfg.batch}, batches {cfg.batches}, "
                           f"topk {cfg.topk}")
        if cfg.verify_layer_compute_us <= 0:
            raise LabError(f"verify compute per layer at {cfg.verify_tokens} tokens comes to "
                           f"{cfg.verify_layer_compute_us:g} us: lower verify_token_compute_us")
        if self.decode_compute_ms <= 0:
            raise LabError(
                f"the decode step's {self.n_allreduce} all-reduces of {cfg.decode_allreduce_us:g} us "
                f"take longer than the whole decode step ({cfg.decode_ms:.2f} ms): lower decode_allreduce_us"
            )

    @property
    def n_allreduce(self) -> int:
        return self.cfg.num_layers * self.cfg.allreduces_per_layer

    def _extra_tokens_ms(self, per_sequence: int) -> float:
        """Compute that the batch's other sequences add to a pass of `per_sequence` tokens each."""
        c = self.cfg
        return c.num_layers * c.verify_token_compute_us * (c.batch - 1) * per_sequence / 1000

    def _measured_pass_ms(self, tokens: int) -> float:
        table = self.cfg.pass_ms_by_tokens
        return interpolate_linear({b: interpolate_linear(row, tokens) for b, row in table.items()}, self.cfg.batch)

    @property
    def verify_compute_ms(self) -> float:
        c = self.cfg
        if c.pass_ms_by_tokens:
            return self._measured_pass_ms(c.verify_tokens)
        return c.num_layers * c.verify_layer_compute_us / 1000 + self._extra_tokens_ms(c.verify_tokens)

    @property
    def decode_compute_ms(self) -> float:
        if self.cfg.pass_ms_by_tokens:
            return self._measured_pass_ms(1)
        return self.cfg.decode_ms - self.n_allreduce * self.cfg.decode_allreduce_us / 1000 + self._extra_tokens_ms(1)

    @property
    def draft_step_us(self) -> float:
        table = self.cfg.draft_step_us_by_batch
        return interpolate_linear(table, self.cfg.batch * self.cfg.topk) if table else self.cfg.draft_step_us

    @property
    def draft_ms(self) -> float:
        extend = self.cfg.draft_extend_us_by_batch
        if not extend:
            return self.cfg.steps * self.draft_step_us / 1000
        return (interpolate_linear(extend, self.cfg.batch) + (self.cfg.steps - 1) * self.draft_step_us) / 1000

    @property
    def message_bytes(self) -> int:
        c = self.cfg
        return c.batch * c.verify_tokens * c.hidden_size * c.dtype_bytes

    @property
    def decode_message_bytes(self) -> int:
        return self.cfg.batch * self.cfg.hidden_size * self.cfg.dtype_bytes

    def verify_ms(self, allreduce: Latency | None = None) -> float:
        """`allreduce`: the verify's all-reduce latency (None: the config's), or a table read at its message size."""
        ar = self.cfg.verify_allreduce_us if allreduce is None else latency_at(allreduce, self.message_bytes)
        return self.verify_compute_ms + self.n_allreduce * ar / 1000

    def decode_ms(self, allreduce: Latency | None = None) -> float:
        """A plain decode step; `allreduce` replaces the decode's own all-reduce where it is faster."""
        ar = self.cfg.decode_allreduce_us
        if allreduce is not None:
            ar = min(ar, latency_at(allreduce, self.decode_message_bytes))
        return self.decode_compute_ms + self.n_allreduce * ar / 1000 + self.cfg.decode_overhead_ms

    def cycle_ms(self, allreduce: Latency | None = None) -> float:
        return self.draft_ms + self.verify_ms(allreduce) + self.cfg.cycle_overhead_ms

    def mean_cycle_ms(self, allreduce: Latency | None = None) -> float:
        """Drafting cycles and the no_draft_share of plain decode steps, averaged."""
        z = self.cfg.no_draft_share
        return (1 - z) * self.cycle_ms(allreduce) + z * self.decode_ms(allreduce)

    def spec_tok_s(self, accept: float, allreduce: Latency | None = None) -> float:
        """All sequences' tokens per second, each sequence emitting `accept` per cycle."""
        return 1000 * self.cfg.batch * accept / self.mean_cycle_ms(allreduce)

    def baseline_tok_s(self, allreduce: Latency | None = None) -> float:
        return 1000 * self.cfg.batch / self.decode_ms(allreduce)

    def break_even(self, allreduce: Latency | None = None) -> float:
        """Served accept length at which speculation matches plain decoding."""
        return self.mean_cycle_ms(allreduce) / self.decode_ms(allreduce)

    def at_steps(self, steps: int) -> CostModel:
        """The same deployment drafting a chain of `steps` tokens (verify = steps + 1 tokens)."""
        return CostModel(dataclasses.replace(with_verify_tokens(self.cfg, steps + 1), steps=steps))


def with_verify_tokens(cfg: CostModelConfig, tokens: int) -> CostModelConfig:
    """The deployment verifying `tokens` tokens: per-layer compute moved by verify_token_compute_us
    per token."""
    compute = cfg.verify_layer_compute_us + cfg.verify_token_compute_us * (tokens - cfg.verify_tokens)
    return dataclasses.replace(cfg, verify_tokens=tokens, verify_layer_compute_us=compute)


def interpolate_linear(table: dict, x: float) -> float:
    """The value at x of a {x: value} table: linear between its points, the first below them, the last
    segment extended beyond them (a single point: its value everywhere)."""
    points = sorted((float(k), float(v)) for k, v in table.items())
    if x <= points[0][0] or len(points) == 1:
        return points[0][1]
    i = min(bisect.bisect_left([p[0] for p in points], x), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (x - x0) * (y1 - y0) / (x1 - x0)


def interpolate_latency(table: dict[int, float], size: int) -> float:
    """Latency at `size` bytes from a {bytes: us} table, linear in log(size); the smallest's below the
    table (latency-bound), and beyond the largest in proportion to size (bandwidth-bound)."""
    sizes = sorted(table)
    if size <= sizes[0]:
        return table[sizes[0]]
    if size >= sizes[-1]:
        return table[sizes[-1]] * size / sizes[-1]
    i = bisect.bisect_left(sizes, size)
    lo, hi = sizes[i - 1], sizes[i]
    w = (math.log(size) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return table[lo] + w * (table[hi] - table[lo])


def _number(value, key: str, path) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise LabError(f"{key} must be a positive number, got {value!r}", path)
    return float(value)


Latency = float | dict[int, float]
"""One all-reduce latency in us, or a measured {message bytes: us} table."""


def latency_at(latency: Latency, message_bytes: int) -> float:
    return interpolate_latency(latency, message_bytes) if isinstance(latency, dict) else latency


def accept_by_steps(histogram, path) -> list[float]:
    """Served accept length at depths 1..S from a chain eval's accept histogram at S steps
    ({served length n: verify steps}, n = 1..S+1; see the module docstring)."""
    try:
        counts = {int(n): int(c) for n, c in histogram.items()}
    except (AttributeError, TypeError, ValueError):
        raise LabError("accept_histogram must map served accept lengths to counts", path) from None
    total = sum(counts.values())
    if total <= 0 or min(counts) < 1 or min(counts.values()) < 0:
        raise LabError("accept_histogram holds no verify steps", path)
    return [sum(c * (min(n - 1, s) + 1) for n, c in counts.items()) / total for s in range(1, max(counts))]


KNOWN_INPUTS = ("allreduce_us", "draft_step_us", "draft_step_us_by_batch", "draft_extend_us_by_batch", "verify_ms",
                "verify_ms_by_tokens", "deployment", "decode_ms", "no_draft_share", "accept_length",
                "served_accept_len", "accept_histogram")
DEPLOYMENT_FIELDS = ("num_layers", "hidden_size", "dtype_bytes", "allreduces_per_layer", "cycle_overhead_ms",
                     "decode_overhead_ms")
OVERHEADS = ("cycle_overhead_ms", "decode_overhead_ms")


def read_inputs(path) -> dict:
    """A measured-inputs JSON: an object with any of KNOWN_INPUTS, or an eval sweep's {"sweep": [eval, ...]}."""
    path = Path(path)
    data = atomic.read_json(path, "cost model inputs file not found")
    if isinstance(data, dict) and "sweep" in data:
        rows = data["sweep"]
        if not (isinstance(rows, list) and rows and all(isinstance(r, dict) and "served_accept_len" in r
                                                        and isinstance((r.get("config") or {}).get("steps"), int)
                                                        for r in rows)):
            raise LabError("sweep must be a list of `eval --json` results (served_accept_len, config.steps)", path)
        return data
    if not isinstance(data, dict) or not any(k in data for k in KNOWN_INPUTS):
        raise LabError(f"no cost model inputs: expected a JSON object with any of {', '.join(KNOWN_INPUTS)}", path)
    return data


def _drafting(cfg: CostModelConfig, data: dict, path) -> CostModelConfig:
    """`cfg` with what an input says about drafting: a benchmark's draft step (by batch), an eval's
    steps, verified tokens and batch (the settings its accept length is priced at), and an n-gram
    lookup's host time and no-match share."""
    over: dict = {}
    if "draft_step_us" in data:  # a measured step (an n-gram lookup's too) replaces the tables
        over.update(draft_step_us=_number(data["draft_step_us"], "draft_step_us", path), draft_step_us_by_batch={},
                    draft_extend_us_by_batch={})
    for key in ("draft_step_us_by_batch", "draft_extend_us_by_batch"):
        if key in data:
            over[key] = _batch_table(data[key], key, path)
    if "no_draft_share" in data:
        z = data["no_draft_share"]
        if isinstance(z, bool) or not isinstance(z, (int, float)) or not 0 <= z < 1:
            raise LabError(f"no_draft_share must be a number in [0, 1), got {z!r}", path)
        over["no_draft_share"] = float(z)
    conf = data.get("config") or {}
    if "served_accept_len" in data and isinstance(conf.get("steps"), int):
        over["steps"] = conf["steps"]
        over["batch"] = batch_of(data)
        over["topk"] = int(conf.get("topk") or 1)
        cfg = with_verify_tokens(cfg, int(conf.get("draft_tokens") or conf["steps"]) + 1)
    return dataclasses.replace(cfg, **over)


def batch_of(result: dict) -> int:
    """Sequences an eval decoded together: the lab's batch, or a served eval's requests in flight (at
    a request rate, the mean the speculative server carried)."""
    c = result["config"]
    if c.get("request_rate") is not None:
        return max(1, round(result["in_flight"]["spec"]))
    return int(c.get("batch") or c.get("concurrency") or 1)


def _batch_table(table, key: str, path) -> dict[int, float]:
    try:
        out = {int(b): _number(us, f"{key}[{b}]", path) for b, us in table.items()}
    except (AttributeError, ValueError):
        raise LabError(f"{key} must map batch sizes to microseconds", path) from None
    if not out or min(out) < 1:
        raise LabError(f"{key} must map batch sizes (>= 1) to microseconds", path)
    return out


def apply_inputs(cfg: CostModelConfig, path) -> tuple[CostModelConfig, Latency | None]:
    """Fold a measured-inputs file into `cfg` (see `fold`)."""
    return fold(cfg, read_inputs(path), path)


def fold(cfg: CostModelConfig, data: dict, path) -> tuple[CostModelConfig, Latency | None]:
    """Fold measured inputs (a benchmark's or an eval's) into `cfg`; returns (config, measured
    all-reduce latency or None)."""
    cfg = _deployment(cfg, data.get("deployment"), path)
    cfg = _drafting(cfg, data, path)
    over: dict = {}
    if "decode_ms" in data:
        over["decode_ms"] = _number(data["decode_ms"], "decode_ms", path)
    extra = []
    if "accept_length" in data:
        extra = data["accept_length"] if isinstance(data["accept_length"], list) else [data["accept_length"]]
        extra = [_number(a, "accept_length", path) for a in extra]
    if "served_accept_len" in data:
        extra.append(round(_number(data["served_accept_len"], "served_accept_len", path), 2))
    if extra:
        over["accept_lengths"] = sorted(set(cfg.accept_lengths) | set(extra))
    if data.get("accept_histogram") is not None:
        topk = (data.get("config") or {}).get("topk", 1)
        if topk == 1:
            over["accept_by_steps"] = accept_by_steps(data["accept_histogram"], path)
        else:  # a tree's depths share nodes: its histogram says nothing about shallower trees
            what = "drafting of unknown topk" if topk is None else f"tree drafting (topk {topk})"
            log(f"{path}: its accept histogram comes from {what}; the draft-steps table needs a chain (topk 1)")
    cfg = dataclasses.replace(cfg, **over)
    if "verify_ms_by_tokens" in data:
        cfg = dataclasses.replace(cfg, pass_ms_by_tokens=_pass_table(data["verify_ms_by_tokens"], path))
    if "verify_ms" in data:
        verify_us = _number(data["verify_ms"], "verify_ms", path) * 1000
        model = CostModel(cfg)
        compute = (verify_us - model.n_allreduce * cfg.verify_allreduce_us) / cfg.num_layers
        if compute <= 0:
            raise LabError(
                f"verify_ms {data['verify_ms']} is shorter than its {model.n_allreduce} all-reduces of "
                f"{cfg.verify_allreduce_us} us",
                path,
            )
        cfg = dataclasses.replace(cfg, verify_layer_compute_us=compute)
    measured = None
    if "allreduce_us" in data:
        ar = data["allreduce_us"]
        if isinstance(ar, dict):
            try:
                measured = {int(k): _number(v, f"allreduce_us[{k}]", path) for k, v in ar.items()}
            except ValueError:
                raise LabError("allreduce_us table keys must be message sizes in bytes", path) from None
            if not measured:
                raise LabError("allreduce_us table is empty", path)
        else:
            measured = _number(ar, "allreduce_us", path)
    return cfg, measured


def _deployment(cfg: CostModelConfig, given, path) -> CostModelConfig:
    if given is None:
        return cfg
    if not isinstance(given, dict) or not set(given) <= set(DEPLOYMENT_FIELDS):
        raise LabError(f"deployment must be an object with some of {', '.join(DEPLOYMENT_FIELDS)}", path)
    over = {}
    for key, value in given.items():
        if key in ("allreduces_per_layer", *OVERHEADS) and value == 0:
            over[key] = value
        elif key in OVERHEADS:
            over[key] = _number(value, f"deployment.{key}", path)
        elif isinstance(value, int) and not isinstance(value, bool) and value > 0:
            over[key] = value
        else:
            raise LabError(f"deployment.{key} must be a positive integer, got {value!r}", path)
    return dataclasses.replace(cfg, **over)


def _pass_table(table, path) -> dict[int, dict[int, float]]:
    try:
        out = {int(b): {int(t): _number(ms, f"verify_ms_by_tokens[{b}][{t}]", path) for t, ms in row.items()}
               for b, row in table.items()}
    except (AttributeError, ValueError):
        raise LabError("verify_ms_by_tokens must map batch sizes to {tokens per row: ms}", path) from None
    if not out or not all(out.values()) or min(out) < 1 or min(t for row in out.values() for t in row) < 1:
        raise LabError("verify_ms_by_tokens must map batch sizes (>= 1) to {tokens per row (>= 1): ms}", path)
    return out


def settings_table(cfg: CostModelConfig, sweep: list[dict], latency: Latency | None = None, path=None) -> list[dict]:
    """One row per swept eval (`eval --steps 2,4 --topk 1,2 ...`): its served accept length priced at
    its own steps and verified tokens (the all-reduce at `latency`, None: the config's own, for that
    many tokens' message)."""
    rows = []
    for e in sweep:
        m = CostModel(_drafting(cfg, e, path))
        accept = _number(e["served_accept_len"], "served_accept_len", path)
        c = e["config"]
        rows.append({"steps": c["steps"], "topk": c.get("topk", 1), "draft_tokens": m.cfg.verify_tokens - 1,
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
        rows.append((f"measured {latency_at(measured, CostModel(cfg).message_bytes):.3g} us", measured))
    return rows


def report(cfg: CostModelConfig, measured: Latency | None = None) -> dict:
    m = CostModel(cfg)
    measured_us = None if measured is None else latency_at(measured, m.message_bytes)
    rows = whatif_latencies(cfg, measured)
    steps = steps_table(cfg)
    return {
        "config": dataclasses.asdict(cfg),
        "n_allreduce": m.n_allreduce,
        "verify_compute_ms": m.verify_compute_ms,
        "verify_ms": m.verify_ms(),
        "draft_step_us": m.draft_step_us,
        "draft_ms": m.draft_ms,
        "cycle_ms": m.cycle_ms(),
        "decode_ms": m.decode_ms(),
        "decode_compute_ms": m.decode_compute_ms,
        "baseline_tok_s": m.baseline_tok_s(),
        "break_even_accept_len": m.break_even(),
        "spec_tok_s": {f"{a:g}": m.spec_tok_s(a) for a in cfg.accept_lengths},
        "measured_allreduce_us": measured_us,
        "message_bytes": m.message_bytes,
        "steps_table": steps,
        "best_steps": best_row(steps),
        "whatif": [_whatif(cfg, m, label, x) for label, x in rows],
        "batch_table": batch_table(cfg, measured),
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
           f"{c['num_layers']} layers x {c['verify_layer_compute_us']:.3g} us compute"
           + (f" (+ {r['verify_compute_ms'] * 1000 / c['num_layers'] - c['verify_layer_compute_us']:.3g} us for the "
              f"batch's other {c['batch'] - 1} x {c['verify_tokens']} tokens)" if batched else ""))
        + f" + {r['n_allreduce']} all-reduces x {c['verify_allreduce_us']:.3g} us = {r['verify_ms']:.2f} ms",
        f"  draft    = {'extend + ' + str(c['steps'] - 1) if c['draft_extend_us_by_batch'] else c['steps']} steps x "
        f"{r['draft_step_us']:.3g} us = {r['draft_ms']:.2f} ms; "
        f"overhead {c['cycle_overhead_ms']:.2f} ms; cycle = {r['cycle_ms']:.2f} ms"
        + (f"; {100 * c['no_draft_share']:.0f} % of cycles draft nothing and decode plainly"
           if c["no_draft_share"] else ""),
        f"  baseline = {r['decode_ms']:.2f} ms per decode step = {r['baseline_tok_s']:.1f} tok/s "
        f"(its all-reduces: {c['decode_allreduce_us']:.3g} us each"
        + (f"; overhead {c['decode_overhead_ms']:.2f} ms" if c["decode_overhead_ms"] else "") + ")",
        "  spec tok/s by served accept length (bonus included): "
        + ", ".join(f"{a} -> {v:.1f}" for a, v in r["spec_tok_s"].items()),
        f"  break-even served accept length: {r['break_even_accept_len']:.2f}",
        "",
        f"what-if: spec tok/s (speedup vs plain decoding with the same all-reduce); "
        f"verify message {r['message_bytes'] / 1024:.0f} KiB",
    ]
    steps = bool(r["steps_table"])
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
            f"draft steps (chain; served accept at each depth, accept_by_steps; verify = steps + 1 tokens, "
            f"{c['verify_allreduce_us']:.3g} us per all-reduce):",
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
            f"batch: the same drafting with B sequences (tok/s of all of them; verify tokens and messages grow "
            f"B-fold, {c['verify_token_compute_us']:g} us of compute per layer per further token)",
            f"{'batch':>5} {'verify ms':>9} {'decode ms':>9} {'base tok/s':>10} {'break-even':>10} | "
            + " ".join(f"{'A=' + a:>16}" for a in accepts),
        ]
        lines += [f"{row['batch']:>5} {row['verify_ms']:>9.2f} {row['decode_ms']:>9.2f} {row['baseline_tok_s']:>10.1f} "
                  f"{row['break_even_accept_len']:>10.2f} | "
                  + " ".join(f"{row['spec_tok_s'][a]:>8.1f} ({row['speedup'][a]:.2f}x)" for a in accepts)
                  for row in r["batch_table"]]
    return "\n".join(lines)


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _serve_flags(steps: int, topk: int, draft_tokens: int) -> str:
    """The settings as SGLang (which counts the verified root among its draft tokens) and vLLM take them."""
    sglang = (f"in SGLang --speculative-num-steps {steps} --speculative-eagle-topk {topk} "
              f"--speculative-num-draft-tokens {draft_tokens + 1}")
    return sglang + (f", in vLLM num_speculative_tokens {steps}" if topk == 1 else "")
