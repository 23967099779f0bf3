"""Shared-memory all-reduce for the tensor-parallel verify step (drafter_lab._C.allreduce).

The verify step's all-reduces are small (1-8 tokens x 7168 x bf16 = 14-115 KB) and latency-bound.
A `Communicator` joins `world_size` processes on one host through a POSIX shared-memory segment:
each rank has two alternating buffers of per-block flag lines and data; a call copies the
input into the rank's slot, releases a uint32 generation flag (with a signature of numel, dtype
and kind beside it), and reads the peers' slots after acquiring theirs.

- one-shot (small messages): every rank reduces the whole message;
- two-shot (large ones): reduce-scatter then all-gather, one rounding per element;
- LL (CUDA backends): one-shot with the readiness inside the data (packets of 4 data bytes beside
  the generation), so a reader polls the data itself, with no flag to wait for;
- the thresholds between them are set (`one_shot_max_bytes=`, `ll_max_bytes=`) or measured at
  init (all ranks agree: the timings are themselves all-reduced);
- sums run in fp32 in rank order 0..N-1 and round once, so every rank gets identical bits;
- `allreduce_residual_rmsnorm` fuses the residual add and RMSNorm into the reduction.

Backends: "cpu" (processes on one host, C++ with acquire/release atomics and spin-then-yield
waits) and, when the extension is built with CUDA, "cuda-host" (the segment registered as mapped
pinned memory; works without P2P) and "cuda-ipc" (device buffers shared with cudaIpcGetMemHandle).

Failures raise `AllReduceError` (a LabError and a RuntimeError) and never hang: a rank that dies,
leaves, or does not arrive within `timeout_s` makes the others raise with the rank, its pid and
the timeout in the message; ranks sending different sizes or dtypes raise instead of mixing data.
The segment's name is removed as soon as every rank has mapped it, so killed runs leak nothing;
a run killed during init leaves a segment that the next init (or `cleanup_stale_segments`) removes.
After a failure a communicator is unusable; create a new one.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import statistics
import time
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from drafter_lab.errors import LabError
from drafter_lab.kernels import _ext

BACKENDS = ("cpu", "cuda-host", "cuda-ipc")
AUTOTUNE_SIZES = (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20)
MAX_BYTES_LIMIT = 1 << 40
"""The largest max_bytes taken: the segment's size (ranks x buffers x max_bytes) stays far inside 64 bits,
where 2**62 wrapped around in the native arithmetic."""


class AllReduceError(LabError, RuntimeError):
    """A rank died, left, timed out, or sent a different call; or the segment could not be set up."""


class AllReduceInputError(LabError, ValueError):
    """Tensors the communicator cannot take (dtype, device, layout, sizes)."""


def _check_whole(name: str, value, most: int) -> None:
    """`value` a whole number in 1..most: else pybind's multi-line TypeError (a float, past 64 bits)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= most:
        raise AllReduceInputError(f"{name} must be a whole number in 1..{most}, got {value!r}")


def _check_threshold(name: str, value) -> int:
    """A threshold in bytes, 0..2**63-1 (the native int64): int() cut 2.5 to 2, its error for a str
    named no setting, and past int64 pybind raised a multi-line TypeError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value < 1 << 63:
        raise AllReduceInputError(f"{name} must be a whole number of bytes >= 0, got {value!r}")
    return int(value)


def _native():
    return _ext.load().allreduce


def _segment_name(native, name) -> str:
    """The fixed segment of a `name=` alone. A name it cannot take is bad input, checked before any
    setup: the native refusal read as a failed setup (AllReduceError), a non-str as pybind's TypeError."""
    if not isinstance(name, str):
        raise AllReduceInputError(f"name must be a str, got {name!r}")
    try:
        return native.segment_name(name)
    except native.CommError as e:
        raise AllReduceInputError(f"name {name!r}: {e}") from None


def _check_file_store(path, tries: int = 5) -> None:
    """Refuse a `path=` that torch's FileStore would hang on: one it cannot open (it retries for 5
    minutes, then raises without the path) or one that holds something else (it waits forever for
    the rest of a record whose length it read from the file's first bytes). A FileStore file is
    records of a little-endian uint32 length and that many bytes, a key and a value each. Read
    without its flock: a FileStore made in another thread holds the GIL while it waits for that
    lock. A peer's append in flight reads as a cut record, so a bad read is tried again first."""
    for attempt in range(tries):
        try:
            with open(path, "ab+") as f:
                f.seek(0)
                data = f.read()
        except OSError as e:  # a missing directory, a directory, no permission
            raise AllReduceError(f"cannot open the rendezvous file store: {e.strerror}", path) from None
        at = strings = 0
        while at + 4 <= len(data):
            at += 4 + int.from_bytes(data[at:at + 4], "little")
            strings += 1
        if at == len(data) and strings % 2 == 0:
            return
        time.sleep(0.05 * 2**attempt)
    raise AllReduceError("is not a torch.distributed FileStore file (records of a uint32 length and bytes, "
                         "key then value); pass a new path or an empty file", path)


class Communicator:
    """One rank of a shared-memory all-reduce group (processes on one host).

    Rendezvous: `store=` (a torch.distributed Store: rank 0 publishes a fresh segment name under
    `drafter_lab/allreduce/<name>/<n>` for the ranks' n-th communicators of that name and world size,
    counted in the store; a failed rendezvous is not counted, so a retry, or the next run on a `path=`
    file, meets its peers), `path=` (a FileStore at that path), or `name=` alone (a fixed segment
    name every rank knows). All ranks must construct their communicators, and then call them, in
    the same order. Several groups on one store (two TP groups of one job) need distinct `name=`s.
    `timeout_s` bounds the init too: ranks that arrive further apart (one still loading weights)
    need a larger one, or communicators made once every rank is ready.

    `one_shot_max_bytes=None` times the algorithms at init (collectively, on the current
    stream); ranks that are streams of one process must pass a value instead. `ll_max_bytes=None`
    is measured with it on the CUDA backends, and is 0 (LL off) when one_shot_max_bytes is given
    or the backend is "cpu".

    Threads may share a communicator: their calls take turns, and `close()` waits for a call in
    flight. A process forked from its owner cannot use it (its calls raise).
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        *,
        name: str | None = None,
        store=None,
        path: str | os.PathLike | None = None,
        max_bytes: int = 1 << 20,
        timeout_s: float = 5.0,
        backend: str = "cpu",
        one_shot_max_bytes: int | None = None,
        ll_max_bytes: int | None = None,
        blocks: int = 16,
        device: int | torch.device | None = None,
    ):
        if backend not in BACKENDS:
            raise LabError(f"unknown all-reduce backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        if store is not None and path is not None:
            raise LabError("pass store= or path=, not both")
        if store is None and path is None and name is None:
            raise LabError("the all-reduce needs a rendezvous: pass store=, path= or name=")
        native = _native()
        # Checked here, on every rank: through a store only rank 0's segment refused a bad value, while
        # the others waited out the timeout for a key it never set (or forever, at timeout_s 0).
        if not 1 <= world_size <= native.max_ranks:
            raise LabError(f"world_size must be in 1..{native.max_ranks}, got {world_size}")
        if not 0 <= rank < world_size:
            raise LabError(f"rank {rank} is outside 0..{world_size - 1}")
        if not timeout_s > 0:
            raise AllReduceInputError(f"timeout_s must be positive, got {timeout_s!r}")
        _check_whole("max_bytes", max_bytes, MAX_BYTES_LIMIT)
        _check_whole("blocks", blocks, native.max_blocks)
        seg = _segment_name(native, name) if store is None and path is None else None
        self._device = self._resolve_device(backend, device)
        if path is not None:
            _check_file_store(path)
            store = dist.FileStore(str(path), world_size)
        self._store = store
        try:
            if self._store is None:
                self._impl = self._open(native, seg, rank, world_size, max_bytes, blocks, timeout_s, backend)
                self._impl.connect()
            else:
                self._rendezvous(native, rank, world_size, name or "default", max_bytes, blocks, timeout_s, backend)
            # Inside the try: a refused threshold or a failed autotune closes the communicator too,
            # so its peers read "closed" at their next call instead of waiting out the timeout.
            if one_shot_max_bytes is None:
                one_shot_max_bytes, tuned_ll = self._autotune(ll=backend != "cpu" and ll_max_bytes is None)
                ll_max_bytes = tuned_ll if ll_max_bytes is None else ll_max_bytes
            self.one_shot_max_bytes = one_shot_max_bytes
            self.ll_max_bytes = ll_max_bytes or 0
        except BaseException as e:
            # The raised error's traceback holds self: unclosed, a failed init kept its segment
            # named and mapped (a retry of the name read "in use", a late peer joined it).
            if "_impl" in self.__dict__:
                self._impl.close()
            if isinstance(e, native.CommError):
                raise AllReduceError(f"rank {rank}: {e}") from None
            if isinstance(e, ValueError):
                raise AllReduceInputError(str(e)) from None
            raise

    def _resolve_device(self, backend: str, device) -> int:
        if backend == "cpu":
            return -1
        if not torch.cuda.is_available():
            raise AllReduceError(f"backend {backend!r} needs a CUDA device; none is visible")
        d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
        return torch.cuda.current_device() if d.index is None else d.index

    def _open(self, native, seg, rank, world_size, max_bytes, blocks, timeout_s, backend):
        return native.Communicator(seg, rank, world_size, max_bytes, blocks, timeout_s, backend, self._device)

    def _rendezvous(self, native, rank, world_size, name, max_bytes, blocks, timeout_s, backend):
        # Each rank counts its communicators in the store itself, so a rank's n-th meets its peers'
        # n-th whichever Store object (or thread, or process) made it; one key per rank and name,
        # and world size (a `path=` file kept by a killed run of another size held its ranks'
        # counts, while the new ranks, counting from 0, waited for a key never published).
        # Only a rendezvous that succeeded counts: one that failed or was killed (its peers never
        # came, or a mismatch) must not leave this rank a number ahead of its peers' next attempt,
        # which would wait for a key never published (a `path=` file reused by the next run).
        count_key = f"drafter_lab/allreduce-count/{rank}/{world_size}/{name}"
        count = self._store.add(count_key, 0)
        key = f"drafter_lab/allreduce/{name}/{count}"
        try:
            if rank == 0:
                self._impl = self._open(native, native.unique_segment_name(), 0, world_size, max_bytes, blocks, timeout_s, backend)
                self._store.set(key, self._impl.name)
            else:
                try:
                    # A store waits forever at 0 ms (timeout_s < 1 ms); timedelta overflows past ~1e14 s (inf)
                    self._store.wait([key], timedelta(seconds=min(max(timeout_s, 1e-3), 1e9)))
                except RuntimeError:
                    raise AllReduceError(
                        f"rank {rank}: rank 0 did not publish the shared segment (store key {key!r}) within {timeout_s:g} s"
                    ) from None
                seg = self._store.get(key).decode()
                self._impl = self._open(native, seg, rank, world_size, max_bytes, blocks, timeout_s, backend)
            self._impl.connect()
        except BaseException:
            if rank == 0:  # the next attempt's rank 1 would join this failed segment
                with contextlib.suppress(RuntimeError):  # the store's own trouble: raise the first error
                    self._store.delete_key(key)
            raise
        if rank == 0:
            self._store.delete_key(key)
        self._store.add(count_key, 1)

    def _autotune(self, ll: bool) -> tuple[int, int]:
        """(one_shot_max_bytes, ll_max_bytes): the largest sizes up to which one-shot beat two-shot
        and LL beat both, from timings summed over all ranks (LL timed only when `ll`)."""
        sizes = [s for s in AUTOTUNE_SIZES if s <= self.capacity]
        if self.world_size == 1 or not sizes:
            return self.capacity, 0
        algos = (1, 2, 3) if ll else (1, 2)
        times = torch.full((len(sizes), len(algos)), float("inf"), device=self.device)
        for i, size in enumerate(sizes):
            x = torch.zeros(size // 4, device=self.device)  # not randn: that advanced the caller's seeded RNG
            for j, algo in enumerate(algos):
                if algo != 3 or size <= self._impl.ll_capacity:
                    times[i, j] = self._median_call_us(x, algo)
        self._call(self._impl.all_reduce, times, times, 1)  # identical sums, so identical choices
        times = times.tolist()
        one_shot = _largest_prefix(sizes, [t[0] <= t[1] for t in times])
        ll_max = _largest_prefix(sizes, [len(t) == 3 and t[2] <= min(t[0], t[1]) for t in times])
        return (self.capacity if one_shot == sizes[-1] else one_shot), ll_max

    def _median_call_us(self, x: torch.Tensor, algo: int, reps: int = 15) -> float:
        sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
        samples = []
        for i in range(reps + 3):
            sync()
            t = time.perf_counter()
            self._call(self._impl.all_reduce, x, x, algo)
            sync()
            if i >= 3:
                samples.append((time.perf_counter() - t) * 1e6)
        return statistics.median(samples)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except Exception as e:
            self._raise(e)

    def all_reduce(self, tensor: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """Sum `tensor` over all ranks into `out` (default: in place); returns the result."""
        out = tensor if out is None else out
        try:
            self._impl.all_reduce(tensor, out, 0)
        except Exception as e:
            self._raise(e)
        return out

    def allreduce_residual_rmsnorm(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float = 1e-6,
        *,
        out: torch.Tensor | None = None,
        residual_out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """s = sum over ranks of x; residual_out = s + residual; out = rmsnorm(residual_out) * weight.

        All in fp32 with one rounding per output (the norm uses the unrounded sum). `residual`
        and `weight` must be the same on every rank, as in tensor parallelism. Pass out=x,
        residual_out=residual to work in place. Returns (out, residual_out).
        """
        out = torch.empty_like(x) if out is None else out
        residual_out = torch.empty_like(residual) if residual_out is None else residual_out
        try:
            self._impl.fused(x, residual, weight, out, residual_out, eps, 0)
        except Exception as e:
            self._raise(e)
        return out, residual_out

    def _raise(self, e: Exception):
        if isinstance(e, _native().CommError):
            raise AllReduceError(str(e)) from None
        if isinstance(e, ValueError):
            raise AllReduceInputError(str(e)) from None
        raise e

    def barrier(self) -> None:
        """Host-side barrier over the group (CUDA backends: does not wait for queued kernels)."""
        self._call(self._impl.barrier)

    def check(self) -> None:
        """CUDA backends: raise what a kernel of this rank recorded (timeout, mismatch); no sync."""
        message = self._call(self._impl.error)
        if message:
            raise AllReduceError(message)

    def close(self) -> None:
        """Unmap the segment (and free CUDA buffers). Peers still waiting on this rank raise."""
        self._impl.close()
        self._store = None

    def __enter__(self) -> Communicator:
        return self

    def __reduce_ex__(self, protocol):
        # A copy would share this rank's seat (two closes, two callers on one generation counter);
        # a pickle would reach another process, which must join the group with its own.
        raise AllReduceError("a Communicator belongs to the process and object that created it: create one in "
                             "each process (it cannot be pickled or copied)")

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def rank(self) -> int:
        return self._call(getattr, self._impl, "rank")

    @property
    def world_size(self) -> int:
        return self._call(getattr, self._impl, "world_size")

    @property
    def backend(self) -> str:
        return self._impl.backend

    @property
    def device(self) -> torch.device:
        """Where this communicator's tensors live."""
        return torch.device("cpu") if self._device < 0 else torch.device("cuda", self._device)

    @property
    def capacity(self) -> int:
        """Bytes one call carries; larger tensors run as several calls."""
        return self._call(getattr, self._impl, "capacity")

    @property
    def one_shot_max_bytes(self) -> int:
        """Messages (or chunks) up to this size run one-shot, larger ones two-shot."""
        return self._impl.one_shot_max_bytes

    @one_shot_max_bytes.setter
    def one_shot_max_bytes(self, value: int) -> None:
        self._call(setattr, self._impl, "one_shot_max_bytes", _check_threshold("one_shot_max_bytes", value))

    @property
    def ll_max_bytes(self) -> int:
        """Calls (or chunks) up to this size run LL where they fit its area (sums: `ll_capacity`
        bytes; fused: the rows a CTA's share of it holds); 0 = never."""
        return self._impl.ll_max_bytes

    @ll_max_bytes.setter
    def ll_max_bytes(self, value: int) -> None:
        self._call(setattr, self._impl, "ll_max_bytes", _check_threshold("ll_max_bytes", value))

    @property
    def ll_capacity(self) -> int:
        """Bytes one LL sum carries: its packets (twice its bytes) fit each CTA's part of the LL
        area, and at most 4 per thread (held until the call is confirmed); 0 on the cpu backend."""
        return self._impl.ll_capacity

    def __repr__(self) -> str:
        if "_impl" not in self.__dict__:  # its constructor failed (a traceback shows it anyway)
            return "Communicator(not connected)"
        if self._impl.closed:
            return "Communicator(closed)"
        return (
            f"Communicator(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r}, "
            f"capacity={self.capacity}, one_shot_max_bytes={self.one_shot_max_bytes}, ll_max_bytes={self.ll_max_bytes})"
        )


def _largest_prefix(sizes: list[int], won: list[bool]) -> int:
    """The largest size before the first loss (0 when the smallest already lost)."""
    best = 0
    for size, w in zip(sizes, won):
        if not w:
            break
        best = size
    return best


class CompletedWork:
    """What `all_reduce(..., async_op=True)` returns: the reduction is already done (CPU) or
    queued on the current stream (CUDA), like a torch.distributed Work after wait(), with the rest
    of Work's face (a DDP communication hook chains on `get_future()`)."""

    def __init__(self, tensor: torch.Tensor):
        self._tensor = tensor
        # is_completed() polls the GPU, as NCCL's Work does: a caller that polls it before reading
        # the tensor off the stream's order must not see the sum while it is still queued
        self._done = torch.cuda.Event() if tensor.is_cuda else None
        if self._done is not None:
            self._done.record(torch.cuda.current_stream(tensor.device))

    def wait(self, timeout=None) -> bool:
        return True  # the current stream already runs after the reduction

    def is_completed(self) -> bool:
        return self._done is None or self._done.query()

    def is_success(self) -> bool:
        return True

    def exception(self) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def result(self) -> list[torch.Tensor]:
        return [self._tensor]

    def get_future(self) -> torch.futures.Future:
        future = torch.futures.Future()
        future.set_result([self._tensor])
        return future


def _reduce_op(op):
    """A ReduceOp for torch.distributed: `op` as one, or its name ("sum", "max", ...)."""
    if not isinstance(op, str):
        return op
    try:
        return getattr(dist.ReduceOp, op.upper())
    except AttributeError:
        raise AllReduceInputError(f"unknown reduce op {op!r}") from None


def all_reduce(tensor: torch.Tensor, op="sum", group=None, async_op: bool = False):
    """torch.distributed.all_reduce's call shape: in place, returns None (or a Work).

    With `group` a Communicator it runs ours (sum only); anything else goes to torch.distributed.
    """
    # A name as torch's path reads it: "SUM" was refused here while a torch group took it.
    reduce_op = _reduce_op(op)
    if not isinstance(group, Communicator):
        return dist.all_reduce(tensor, op=reduce_op, group=group, async_op=async_op)
    if reduce_op != dist.ReduceOp.SUM:
        raise AllReduceInputError(f"the shared-memory all-reduce only sums, got op={op!r}")
    group.all_reduce(tensor)
    return CompletedWork(tensor) if async_op else None


def cleanup_stale_segments(min_age_s: float = 30.0) -> list[str]:
    """Remove all-reduce segments whose processes are all dead; returns their names."""
    return list(_native().cleanup_stale(min_age_s))


def sum_native(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Reference all-reduce of the per-rank tensors: fp32 in rank order, rounded once."""
    acc = parts[0].float()
    for p in parts[1:]:
        acc = acc + p.float()
    return acc.to(parts[0].dtype)


def residual_rmsnorm_native(
    parts: Sequence[torch.Tensor], residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of `allreduce_residual_rmsnorm` from the per-rank inputs: (out, residual_out)."""
    acc = parts[0].float()
    for p in parts[1:]:
        acc = acc + p.float()
    r = acc + residual.float()
    normed = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return normed.to(residual.dtype), r.to(residual.dtype)
