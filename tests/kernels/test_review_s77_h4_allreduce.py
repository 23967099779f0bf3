"""All-reduce (CPU backend), s77 mutation audit: a bad `name=` or threshold is one line of bad input,
the smallest max_bytes and blocks, the no-GPU refusal, the autotune's LL choice, and `out=`."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from drafter_lab.kernels import _ext

pytestmark = pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built")

SHM = Path("/dev/shm")


def _tag(what: str) -> str:
    return f"s77-{what}-{os.getpid()}-{secrets.token_hex(4)}"


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("a/b", "may only hold letters, digits"),
        ("", "1 to 200 characters"),
        ("x" * 201, "1 to 200 characters"),
        (5, "name must be a str, got 5"),
    ],
)
def test_a_name_alone_that_no_segment_can_take_is_bad_input(name, says):
    """It was the native CommError, so an AllReduceError (a failed setup), or pybind's TypeError."""
    import torch  # noqa: F401  drafter_lab._C needs torch loaded first

    from drafter_lab.kernels.allreduce import AllReduceInputError, Communicator

    with pytest.raises(AllReduceInputError) as info:
        Communicator(0, 1, name=name, one_shot_max_bytes=0)
    text = str(info.value)
    assert says in text and "\n" not in text, text
    if isinstance(name, str):
        assert text.startswith(f"name {name!r}: "), text


def test_a_name_of_200_characters_is_taken():
    from drafter_lab.kernels.allreduce import Communicator

    tag = _tag("long")
    tag += "x" * (200 - len(tag))
    with Communicator(0, 1, name=tag, one_shot_max_bytes=0) as comm:
        assert comm.world_size == 1


@pytest.mark.parametrize("backend", ["cuda-host", "cuda-ipc"])
def test_a_cuda_backend_without_a_visible_gpu_says_so_before_any_setup(backend):
    """Unchecked, torch.cuda.current_device() raised an AssertionError ("Torch not compiled with
    CUDA"), or the native build's refusal came back as a failed setup of rank 0."""
    import torch

    from drafter_lab.kernels.allreduce import AllReduceError, Communicator

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    name = _tag("nogpu")
    with pytest.raises(AllReduceError, match=rf"^backend '{backend}' needs a CUDA device; none is visible$"):
        Communicator(0, 1, name=name, backend=backend, one_shot_max_bytes=0)
    assert not (SHM / f"drafter_lab_ar.{name}").exists()


def test_max_bytes_and_blocks_of_1_are_taken():
    """The smallest values of the range: a sum still runs, as several calls of one byte's capacity."""
    import torch

    from drafter_lab.kernels.allreduce import Communicator

    with Communicator(0, 1, name=_tag("least"), max_bytes=1, blocks=1, one_shot_max_bytes=0) as comm:
        x = torch.arange(5, dtype=torch.float32)
        assert torch.equal(comm.all_reduce(x.clone()), x)


def test_no_rendezvous_at_all_is_named_as_such():
    """Unchecked, it went on as a `name=` of None (a non-str name)."""
    from drafter_lab.errors import LabError
    from drafter_lab.kernels.allreduce import Communicator

    with pytest.raises(LabError, match=r"^the all-reduce needs a rendezvous: pass store=, path= or name=$"):
        Communicator(0, 1, one_shot_max_bytes=0)


class _WithLL:
    """A cpu communicator's native side with an LL area of `ll_capacity` bytes (the cpu backend has
    none), so the autotune's LL choice runs here; everything else is the real communicator's."""

    def __init__(self, impl, ll_capacity: int):
        self._real = impl
        self.ll_capacity = ll_capacity

    def __getattr__(self, attr):
        return getattr(self._real, attr)


def _tune_ll(monkeypatch, times, ll=True, ll_capacity=64 << 10):
    """Both ranks (threads) tune with LL area `ll_capacity`; `times(size, algo)` gives the timings.
    Returns (rank 0's (one_shot_max_bytes, ll_max_bytes), its capacity, the (size, algo)s it timed)."""
    import torch.distributed as dist
    from test_allreduce_review import _pair  # this directory is on sys.path (pytest prepends it)

    from drafter_lab.kernels.allreduce import Communicator

    timed = {0: [], 1: []}

    def median(self, x, algo, reps=15):
        size = x.numel() * x.element_size()
        timed[self.rank].append((size, algo))
        return times(size, algo)

    monkeypatch.setattr(Communicator, "_median_call_us", median)
    store = dist.HashStore()

    def rank(r):
        with Communicator(r, 2, store=store, timeout_s=10, max_bytes=4 << 20, one_shot_max_bytes=0) as comm:
            comm._impl = _WithLL(comm._impl, ll_capacity)
            return comm._autotune(ll=ll), comm.capacity

    results, errors = _pair(rank)
    assert not errors, errors
    assert results[0] == results[1] and timed[0] == timed[1]
    return (*results[0], timed[0])


def test_ll_is_timed_only_where_it_fits_and_kept_where_it_ties_the_best(monkeypatch):
    """LL as fast as one-shot at every size it fits: it runs up to its area's size, 64 KiB, which is
    itself timed; the larger sizes, never timed for LL, end its range."""
    (one_shot, ll_max), capacity, timed = _tune_ll(monkeypatch, lambda size, algo: {1: 1.0, 2: 2.0, 3: 1.0}[algo])
    assert (one_shot, ll_max) == (capacity, 64 << 10)
    want = [(s, a) for s in (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20) for a in (1, 2, 3) if a != 3 or s <= 64 << 10]
    assert timed == want


@pytest.mark.parametrize(
    ("one", "two", "ll"),
    [(1.0, 3.0, 2.0), (3.0, 1.0, 2.0)],
    ids=["one-shot-best", "two-shot-best"],
)
def test_ll_that_loses_to_either_algorithm_is_not_taken(monkeypatch, one, two, ll):
    """LL must beat the better of one-shot and two-shot, whichever that is."""
    (_, ll_max), _, _ = _tune_ll(monkeypatch, lambda size, algo: {1: one, 2: two, 3: ll}[algo])
    assert ll_max == 0


def test_without_ll_only_one_shot_and_two_shot_are_timed(monkeypatch):
    """A given ll_max_bytes (or the cpu backend) leaves LL untimed and off, however fast it would be."""
    (one_shot, ll_max), capacity, timed = _tune_ll(monkeypatch, lambda size, algo: {1: 1.0, 2: 2.0, 3: 0.5}[algo], ll=False)
    assert (one_shot, ll_max) == (capacity, 0)
    assert {algo for _, algo in timed} == {1, 2}


@pytest.mark.parametrize(
    ("kw", "got"),
    [
        ({"one_shot_max_bytes": "many"}, "'many'"),
        ({"one_shot_max_bytes": 2.5}, "2.5"),
        ({"one_shot_max_bytes": True}, "True"),
        ({"one_shot_max_bytes": -1}, "-1"),
        ({"one_shot_max_bytes": 2**63}, str(2**63)),
        ({"one_shot_max_bytes": 0, "ll_max_bytes": 2.5}, "2.5"),
    ],
    ids=["str", "float", "bool", "negative", "past-int64", "ll-float"],
)
def test_a_threshold_that_is_no_whole_number_of_bytes_is_one_line_naming_it(kw, got):
    """int() cut 2.5 to 2 (and True to 1) silently, said "invalid literal for int()" for a str, and
    past int64 pybind raised its multi-line TypeError."""
    from drafter_lab.kernels.allreduce import AllReduceInputError, Communicator

    name = "ll_max_bytes" if "ll_max_bytes" in kw else "one_shot_max_bytes"
    with pytest.raises(AllReduceInputError) as info:
        Communicator(0, 1, name=_tag("threshold"), **kw)
    assert str(info.value) == f"{name} must be a whole number of bytes >= 0, got {got}"


def test_a_threshold_set_later_is_checked_too():
    import numpy as np

    from drafter_lab.kernels.allreduce import AllReduceInputError, Communicator

    with Communicator(0, 1, name=_tag("setter"), one_shot_max_bytes=0) as comm:
        comm.one_shot_max_bytes = np.int64(4096)  # a numpy whole number is one
        assert comm.one_shot_max_bytes == 4096
        with pytest.raises(AllReduceInputError, match=r"^one_shot_max_bytes must be a whole number of bytes >= 0, got 1.5$"):
            comm.one_shot_max_bytes = 1.5
        assert comm.one_shot_max_bytes == 4096


def test_a_sum_into_out_leaves_its_input_alone_and_returns_out():
    """Without `out` the sum is in place; with it, the input was overwritten and returned instead."""
    import torch

    from drafter_lab.kernels.allreduce import Communicator

    with Communicator(0, 1, name=_tag("out"), one_shot_max_bytes=0) as comm:
        x = torch.arange(6, dtype=torch.float32)
        out = torch.full((6,), -1.0)
        got = comm.all_reduce(x, out=out)
        assert got is out and torch.equal(out, torch.arange(6, dtype=torch.float32))
        assert torch.equal(x, torch.arange(6, dtype=torch.float32))
        assert comm.all_reduce(x) is x


def test_the_fused_op_writes_into_the_outs_it_is_given_and_returns_them():
    """A given `out` was dropped for a new tensor, so out=x (in place) left x unnormed."""
    import torch

    from drafter_lab.kernels.allreduce import Communicator, residual_rmsnorm_native

    x = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    residual = torch.tensor([[0.25, 0.5, -1.0, 2.0]])
    weight = torch.tensor([1.0, 2.0, 0.5, 1.5])
    want_out, want_residual = residual_rmsnorm_native([x], residual, weight)
    with Communicator(0, 1, name=_tag("fused-out"), one_shot_max_bytes=0) as comm:
        xs, rs = x.clone(), residual.clone()
        out, residual_out = comm.allreduce_residual_rmsnorm(xs, rs, weight, out=xs, residual_out=rs)
    assert out is xs and residual_out is rs
    assert torch.allclose(xs, want_out) and torch.equal(rs, want_residual)
