"""The all-reduce's Python face as a drop-in for torch.distributed: a store rendezvous with no
timeout, a zero, negative or sub-millisecond one, a rendezvous file kept by a killed run of another
world size, a threshold refused at init, and the autotune's effect on the caller's RNG. Ranks are
threads of this process."""

from __future__ import annotations

import os
import secrets
import threading
import time

import pytest
import torch
import torch.distributed as dist
from test_allreduce_review import _pair  # this directory is on sys.path (pytest prepends it)

from drafter_lab.kernels import _ext

pytestmark = pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built")


def test_no_timeout_through_a_store_meets_its_peers():
    """timeout_s=inf (the C++ side's "no timeout") made rank 1's wait for rank 0's key an
    OverflowError traceback, and left rank 0 waiting for it (forever, at inf)."""
    from drafter_lab.kernels.allreduce import Communicator

    store = dist.HashStore()

    def rank(r):
        with Communicator(r, 2, store=store, timeout_s=5 if r == 0 else float("inf"), one_shot_max_bytes=0) as comm:
            return comm.all_reduce(torch.full((3,), r + 1.0))

    results, errors = _pair(rank)
    assert not errors, errors
    assert all(torch.equal(results[r], torch.full((3,), 3.0)) for r in (0, 1))


@pytest.mark.parametrize("timeout_s", [0, -1.0, float("nan")])
def test_a_timeout_that_is_not_positive_is_refused_on_every_rank(timeout_s):
    """Only rank 0 refused it (natively): a rank 1 waited for rank 0's key with the store's
    "no timeout" at 0 (forever), or blamed rank 0 for not publishing "within -1 s"."""
    from drafter_lab.kernels.allreduce import AllReduceInputError, Communicator

    result = []
    t = threading.Thread(target=lambda: result.append(_raised(Communicator, 1, 2, store=dist.HashStore(),
                                                                timeout_s=timeout_s, one_shot_max_bytes=0)),
                         daemon=True)  # without the check, at 0 it never returns
    t.start()
    t.join(10)
    assert result and isinstance(result[0], AllReduceInputError), result
    assert str(result[0]) == f"timeout_s must be positive, got {timeout_s!r}"


def test_a_timeout_under_a_millisecond_through_a_store_times_out():
    """It rounded to a 0 ms store wait, which a store takes as no timeout: rank 1 waited forever."""
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator

    result = []
    t = threading.Thread(target=lambda: result.append(_raised(Communicator, 1, 2, store=dist.HashStore(),
                                                                timeout_s=0.0004, one_shot_max_bytes=0)),
                         daemon=True)
    t.start()
    t.join(10)
    assert result and isinstance(result[0], AllReduceError) and "did not publish" in str(result[0]), result


def _raised(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as e:
        return e
    return None


def test_a_rendezvous_file_kept_by_a_run_of_another_world_size_does_not_hold_up_the_next(tmp_path):
    """A killed run leaves its FileStore file with its ranks' counts: the next run on that path
    with more ranks had ranks 0-1 publish under their count while rank 2, counting from 0, waited
    for a key never published (every later run of that size failed the same way)."""
    from drafter_lab.kernels.allreduce import Communicator

    path = tmp_path / "store"
    killed = dist.FileStore(str(path), 1)  # a killed run's store: the file is never removed
    for world in (2, 3, 2):

        def rank(r, world=world):
            with Communicator(r, world, path=path, timeout_s=3, one_shot_max_bytes=0) as comm:
                return comm.all_reduce(torch.full((4,), r + 1.0))

        results, errors = _pair(rank, range(world))
        assert not errors, (world, errors)
        total = world * (world + 1) / 2
        assert all(torch.equal(results[r], torch.full((4,), total)) for r in range(world)), world
    del killed


@pytest.mark.parametrize("bad", [{"ll_max_bytes": 64}, {"one_shot_max_bytes": -1}])
def test_a_threshold_refused_at_init_closes_the_communicator(bad):
    """The thresholds were set after the init, outside its cleanup: the refusing rank's error
    (held, as a REPL or a log handler holds it) kept its communicator open, so its peer's first
    call waited out the whole timeout for it instead of reading that it closed."""
    from drafter_lab.kernels.allreduce import AllReduceError, AllReduceInputError, Communicator

    tag = f"test-refused-threshold-{os.getpid()}-{secrets.token_hex(4)}"
    kwargs = {0: {"one_shot_max_bytes": 0}, 1: {"one_shot_max_bytes": 0, **bad}}
    comms, errors = _pair(lambda r: Communicator(r, 2, name=tag, timeout_s=10, **kwargs[r]))
    assert isinstance(errors.get(1), AllReduceInputError) and 0 not in errors, errors
    t = time.monotonic()
    try:
        with pytest.raises(AllReduceError, match="rank 1 closed its communicator"):
            comms[0].all_reduce(torch.ones(4))
    finally:
        comms[0].close()
    assert time.monotonic() - t < 5
    with open("/proc/self/maps") as f:
        assert tag not in f.read(), "the refusing rank's segment is still mapped"


def test_the_autotune_leaves_the_callers_rng_alone():
    """It timed the algorithms on torch.randn inputs: a seeded run drew other numbers after
    building an autotuned communicator than with a set threshold or a single rank."""
    from drafter_lab.kernels.allreduce import Communicator

    store = dist.HashStore()
    torch.manual_seed(0)
    before = torch.get_rng_state()

    def rank(r):
        with Communicator(r, 2, store=store, timeout_s=10, max_bytes=16 << 10) as comm:
            return comm.one_shot_max_bytes

    results, errors = _pair(rank)
    assert not errors, errors
    assert results[0] == results[1]
    assert torch.equal(torch.get_rng_state(), before)


def test_the_async_work_has_torchs_face():
    """A DDP communication hook chains on `work.get_future()`; our Work had only wait() and
    is_completed(), an AttributeError for a drop-in caller."""
    from drafter_lab.kernels.allreduce import Communicator, all_reduce

    with Communicator(0, 1, name=f"test-work-{os.getpid()}-{secrets.token_hex(4)}") as comm:
        x = torch.arange(4.0)
        work = all_reduce(x, group=comm, async_op=True)
        assert work.wait() and work.is_completed() and work.is_success() and work.exception() is None
        work.synchronize()
        assert work.result()[0] is x
        done = work.get_future().then(lambda f: f.value()[0] * 2)
        assert torch.equal(done.wait(), torch.arange(4.0) * 2)


def test_a_reduce_op_named_as_a_string_reaches_a_torch_group():
    """op="max" went to dist.all_reduce as the string: a pybind TypeError."""
    from drafter_lab.kernels.allreduce import AllReduceInputError, all_reduce

    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1)
    x = torch.tensor([1.0, 5.0])
    assert all_reduce(x, op="max", group=group) is None and torch.equal(x, torch.tensor([1.0, 5.0]))
    all_reduce(x, op="sum", group=group, async_op=True).wait()
    with pytest.raises(AllReduceInputError, match="unknown reduce op 'mean'"):
        all_reduce(x, op="mean", group=group)


def test_a_world_of_no_ranks_is_named_as_such():
    """It said "rank 0 is outside 0..-1"."""
    from drafter_lab.errors import LabError
    from drafter_lab.kernels.allreduce import Communicator

    with pytest.raises(LabError, match=r"^world_size must be in 1\.\.16, got 0$"):
        Communicator(0, 0, name="never")


@pytest.mark.parametrize(("world", "kw", "message"), [
    (17, {}, r"^world_size must be in 1\.\.16, got 17$"),
    (2, {"max_bytes": 0}, r"^max_bytes must be a whole number in 1\.\.1099511627776, got 0$"),
    (2, {"blocks": 65}, r"^blocks must be a whole number in 1\.\.64, got 65$"),
])
def test_settings_only_rank_0s_segment_refused_fail_every_rank_at_once(world, kw, message):
    """Through a store, rank 1 waited out its whole timeout for the segment rank 0 never published,
    then blamed rank 0, whose own error said what was wrong."""
    from drafter_lab.errors import LabError
    from drafter_lab.kernels.allreduce import Communicator

    with pytest.raises(LabError, match=message):
        Communicator(1, world, store=dist.HashStore(), timeout_s=5, one_shot_max_bytes=0, **kw)
