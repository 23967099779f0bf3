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
at batch x topk rows (a tree drafts topk children per row) when there is one, else it stays flat;
a cycle's first draft (the extend through fc) runs one row per sequence, topk or not. Both tok/s count all B sequences:

    spec tok/s = 1000 x B x A / mean cycle,   baseline = 1000 x B / decode_ms(B)

so a verify that grows faster than the decode step (per-token compute, larger all-reduces) eats
the gain as B grows; `batches` prints the break-even accept length and tok/s at each.

The preset `seeds-kimi-k2.5-8x-pcie` is the seeds' deployment (Kimi-K2.5, 61 layers, 8 PCIe
GPUs, tensor parallel): 82 tok/s without speculation, verify ~30 ms of which ~25 ms is 122
all-reduces of ~205 us, draft ~0.66 ms per cycle; served accept 2.0 gave ~60 tok/s and 1.5 gave
~52 tok/s. Plain decoding at 82 tok/s with the verify's per-layer compute (5.0 ms) leaves
59 us per decode all-reduce (the decode step's messages are 4x smaller). The two seed points imply 33.3 and 28.8 ms per cycle: no fixed cycle time matches both,
so the preset's overhead (0.43 ms) splits the difference, giving 64 and 48 tok/s (+-7 %).

Measured inputs come from files (`costinputs`); the tables and the printed report are in
`costreport`.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass, field

from drafter_lab.errors import LabError


@dataclass
class CostModelConfig:
    """Inputs of the verify-step cost model (times per cycle or per step, one sequence)."""

    num_layers: int = 61
    """Target decoder layers."""
    allreduces_per_layer: int = 2
    """Tensor-parallel all-reduces per layer (attention output + MLP/MoE output)."""
    verify_layer_compute_us: float = 82.0
    """Compute of one layer in the verify pass (everything but all-reduces) of
    `verify_compute_tokens` tokens, microseconds."""
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
    flat, as for memory-bound dense layers; an MoE layer reads more experts as tokens grow. A verify
    of verify_tokens tokens (an eval's, a draft-steps or settings row's) moves verify_layer_compute_us
    by this much per token it verifies beyond verify_compute_tokens."""
    verify_compute_tokens: int = 4
    """Tokens per verify at which verify_layer_compute_us holds: the preset's, or those of the verify
    an input measured (`verify_ms`)."""
    measured_verify_ms: float = 0.0
    """A measured whole verify pass of verify_compute_tokens tokens, all-reduces included,
    milliseconds (`--inputs`' verify_ms): > 0 prices a layer's verify compute as what is left of it
    after its n_allreduce x verify_allreduce_us, in place of verify_layer_compute_us. Derived after
    every input and flag, so the deployment they describe reproduces the measurement."""
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
    one draft step at one row per sequence (steps x draft step with no tables, as the preset was calibrated)."""
    topk: int = 1
    """Children per expanded node (tree drafting): a draft step runs batch x topk drafter rows, so
    draft_step_us_by_batch is read at that many. `--inputs` takes an eval's."""
    accept_by_steps: list[float] = field(default_factory=list)
    """Served accept length with 1, 2, ... draft steps (chain drafting); given, the draft-steps table
    picks the depth that maximises tok/s. `--inputs` derives it from an eval's accept histogram."""


PRESETS = {
    "seeds-kimi-k2.5-8x-pcie": CostModelConfig(),
}


POSITIVE = ("num_layers", "verify_layer_compute_us", "decode_ms", "draft_step_us", "steps", "hidden_size",
            "dtype_bytes", "verify_tokens", "verify_compute_tokens", "batch", "topk")
NON_NEGATIVE = ("allreduces_per_layer", "verify_allreduce_us", "decode_allreduce_us", "cycle_overhead_ms",
                "decode_overhead_ms", "verify_token_compute_us", "measured_verify_ms")
POSITIVE_LISTS = ("accept_lengths", "whatif_allreduce_us", "batches", "accept_by_steps")
COUNTS = {"num_layers": "target layers", "allreduces_per_layer": "all-reduces per layer", "steps": "draft steps",
          "hidden_size": "target hidden size", "dtype_bytes": "bytes per element", "verify_tokens": "tokens per verify",
          "verify_compute_tokens": "tokens of the measured verify", "batch": "sequences", "topk": "children per node"}
"""The fields that count something, with what they count: whole numbers, as the flags and an input file take them."""

MAX_DRAFT_STEPS = 64
"""Above any engine's draft depth: bounds an accept_by_steps list (each depth is priced, again per what-if
row) and an accept histogram whose eval did not give its steps."""


def finite(v) -> bool:
    """Whether `v` is a number (not a bool) that is finite as a float: an integer past float's range (a flag's
    or a JSON file's 400 digits) is not, where math.isfinite raised an OverflowError traceback."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _count(v) -> bool:
    """Whether `v` is a whole number >= 1 (not a bool, not past float's range): a table's batch or tokens."""
    return isinstance(v, int) and finite(v) and v >= 1


def check_fields(cfg: CostModelConfig) -> None:
    """Every count and time a finite number on its side of zero (a flag's NaN or negative overhead
    printed nonsense tables), each field on its own, and the verify measured once: what the fields make
    together is CostModel's to judge."""
    for name in POSITIVE:
        if not (finite(v := getattr(cfg, name)) and v > 0):
            raise LabError(f"{name} must be a finite number > 0, got {v!r}")
    for name in NON_NEGATIVE:
        if not (finite(v := getattr(cfg, name)) and v >= 0):
            raise LabError(f"{name} must be a finite number >= 0, got {v!r}")
    # from Python too: 2.5 all-reduces per layer priced 152.5 of them, and 2.5 steps 2.5 draft steps
    for name, what in COUNTS.items():
        if not isinstance(v := getattr(cfg, name), int):
            side = ">= 0" if name in NON_NEGATIVE else "> 0"
            raise LabError(f"{name} must be a whole number {side} ({what}), got {v!r}")
    for name in POSITIVE_LISTS:
        if not all(finite(v) and v > 0 for v in getattr(cfg, name)):
            raise LabError(f"{name} must hold finite numbers > 0, got {getattr(cfg, name)!r}")
    if not all(isinstance(b, int) for b in cfg.batches):  # each a batch table row's `batch`
        raise LabError(f"batches must hold whole numbers > 0 (sequences), got {cfg.batches!r}")
    # from Python too, as `batches` is: a batch of 1.5 sequences was priced as a measured point of its own
    for name in ("draft_step_us_by_batch", "draft_extend_us_by_batch"):
        table = getattr(cfg, name)
        if not all(_count(b) and finite(us) and us > 0 for b, us in table.items()):
            raise LabError(f"{name} must map whole batch sizes (>= 1) to finite microseconds > 0, got {table!r}")
    passes = cfg.pass_ms_by_tokens  # an empty row was an IndexError, and a NaN pass priced NaN tok/s
    if not all(_count(b) and row and all(_count(t) and finite(ms) and ms > 0 for t, ms in row.items())
               for b, row in passes.items()):
        raise LabError("pass_ms_by_tokens must map whole batch sizes (>= 1) to {whole tokens per row (>= 1): finite "
                       f"ms > 0}}, got {passes!r}")
    for name in ("accept_lengths", "accept_by_steps"):
        if any(a < 1 for a in getattr(cfg, name)):
            raise LabError(f"{name} must be at least 1 (a served accept length counts the bonus token), "
                           f"got {getattr(cfg, name)!r}")
    if len(cfg.accept_by_steps) > MAX_DRAFT_STEPS:
        raise LabError(f"accept_by_steps lists {len(cfg.accept_by_steps)} depths, above the {MAX_DRAFT_STEPS} draft "
                       "steps any engine drafts")
    if not cfg.accept_lengths:  # the main table would have no row
        raise LabError("accept_lengths is empty: give at least one served accept length")
    if not (finite(z := cfg.no_draft_share) and 0 <= z < 1):  # nan too; a str was a TypeError, False taken as 0
        raise LabError(f"no_draft_share must be in [0, 1), got {z!r}")
    # The table priced the verify: a verify_ms beside it was ignored, yet refused when shorter than its all-reduces.
    if cfg.measured_verify_ms and cfg.pass_ms_by_tokens:
        raise LabError(f"a measured verify_ms (measured_verify_ms {cfg.measured_verify_ms:g}) and a `bench verify` pass "
                       "table (verify_ms_by_tokens) both price the verify: give one of them")


class CostModel:
    def __init__(self, cfg: CostModelConfig):
        self.cfg = cfg
        check_fields(cfg)
        if self._layer_base_us <= 0:
            raise LabError(f"the measured verify_ms {cfg.measured_verify_ms:g} is shorter than its {self.n_allreduce} "
                           f"all-reduces of {cfg.verify_allreduce_us:g} us: lower verify_allreduce_us")
        # a pass table prices the verify: the per-layer fields it replaces may come to anything
        if not cfg.pass_ms_by_tokens and self.layer_compute_us <= 0:
            raise LabError(f"verify compute per layer at {cfg.verify_tokens} tokens comes to "
                           f"{self.layer_compute_us:g} us: lower verify_token_compute_us")
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
    def _layer_base_us(self) -> float:
        """One layer's verify compute at verify_compute_tokens: the measured pass's, else the field's."""
        c = self.cfg
        if c.measured_verify_ms:
            return (1000 * c.measured_verify_ms - self.n_allreduce * c.verify_allreduce_us) / c.num_layers
        return c.verify_layer_compute_us

    @property
    def layer_compute_us(self) -> float:
        """One layer's verify compute for one sequence's verify_tokens tokens."""
        c = self.cfg
        return self._layer_base_us + c.verify_token_compute_us * (c.verify_tokens - c.verify_compute_tokens)

    @property
    def verify_compute_ms(self) -> float:
        c = self.cfg
        if c.pass_ms_by_tokens:
            return self._measured_pass_ms(c.verify_tokens)
        return c.num_layers * self.layer_compute_us / 1000 + self._extra_tokens_ms(c.verify_tokens)

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
    def first_draft_us(self) -> float:
        """A cycle's first draft, the extend over each sequence's accepted tokens: one row per sequence even
        in a tree (whose topk-wide rows start at the second step), so a step table is read at the batch."""
        table = self.cfg.draft_extend_us_by_batch or self.cfg.draft_step_us_by_batch
        return interpolate_linear(table, self.cfg.batch) if table else self.cfg.draft_step_us

    @property
    def draft_ms(self) -> float:
        return (self.first_draft_us + (self.cfg.steps - 1) * self.draft_step_us) / 1000

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

    def decode_allreduce_us(self, allreduce: Latency | None = None) -> float:
        """A plain decode step's all-reduce: `allreduce` replaces the decode's own where it is faster."""
        ar = self.cfg.decode_allreduce_us
        return ar if allreduce is None else min(ar, latency_at(allreduce, self.decode_message_bytes))

    def decode_ms(self, allreduce: Latency | None = None) -> float:
        """A plain decode step (`decode_allreduce_us`)."""
        return self.decode_compute_ms + self.n_allreduce * self.decode_allreduce_us(allreduce) / 1000 + self.cfg.decode_overhead_ms

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
        """The same deployment drafting a chain of `steps` tokens (verify = steps + 1 tokens; one drafter
        row per sequence, whatever tree the config was measured with)."""
        return CostModel(dataclasses.replace(self.cfg, verify_tokens=steps + 1, steps=steps, topk=1))


def on_allreduce(cfg: CostModelConfig, allreduce: Latency | None) -> CostModelConfig:
    """`cfg` on a deployment whose all-reduce is `allreduce` (an input's measured one; None: the config's
    own). A measured verify_ms is split at that all-reduce, read at the measured pass's own message (one
    sequence of verify_compute_tokens), so the deployment reproduces the measurement: split at the
    config's 205 us beside a measured 28.8 us, a measured 30 ms verify was priced at 8.5 ms, and one of
    10 ms beside a measured 40 us was refused as shorter than its all-reduces."""
    if allreduce is None or not cfg.measured_verify_ms:
        return cfg
    check_fields(cfg)  # num_layers 0 divides below
    n = cfg.num_layers * cfg.allreduces_per_layer
    ar = latency_at(allreduce, cfg.verify_compute_tokens * cfg.hidden_size * cfg.dtype_bytes)
    compute_us = (1000 * cfg.measured_verify_ms - n * ar) / cfg.num_layers
    if compute_us <= 0:
        raise LabError(f"the measured verify_ms {cfg.measured_verify_ms:g} is shorter than its {n} all-reduces "
                       f"of {us_text(ar)} us (measured)")
    return dataclasses.replace(cfg, verify_layer_compute_us=compute_us, measured_verify_ms=0.0)


def interpolate_linear(table: dict, x: float) -> float:
    """The value at x of a {x: value} cost table (by batch): linear between its points, the first below
    them, the last segment extended beyond them but never downward (a single point: its value
    everywhere). Costs do not fall with batch; a noisy last segment that does would price a large batch
    below zero."""
    points = sorted((float(k), float(v)) for k, v in table.items())
    if x <= points[0][0] or len(points) == 1:
        return points[0][1]
    i = min(bisect.bisect_left([p[0] for p in points], x), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    slope = (y1 - y0) / (x1 - x0)
    # `<`: at a measured point y1 itself (y0 + (x1 - x0) * slope gave 0.1 back as 0.09999999999999998)
    return y0 + (x - x0) * slope if x < x1 else y1 + (x - x1) * max(slope, 0.0)


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


Latency = float | dict[int, float]
"""One all-reduce latency in us, or a measured {message bytes: us} table."""


def latency_at(latency: Latency, message_bytes: int) -> float:
    return interpolate_latency(latency, message_bytes) if isinstance(latency, dict) else latency


def us_text(us: float) -> str:
    """Microseconds to three significant figures as a table shows them: 1280, not .3g's 1.28e+03."""
    return f"{us:.0f}" if abs(us) >= 99.95 else f"{us:.3g}"
