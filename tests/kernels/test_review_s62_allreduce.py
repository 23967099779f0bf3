"""All-reduce face (CPU backend): a sparse input, a pickled or copied communicator, check() once closed."""
import copy
import os
import pickle
import secrets

import pytest
import torch

pytest.importorskip("drafter_lab._C")


def _comm(what: str):
    from drafter_lab.kernels.allreduce import Communicator

    return Communicator(0, 1, name=f"test-{what}-{os.getpid()}-{secrets.token_hex(4)}", one_shot_max_bytes=0)


def test_a_sparse_tensor_is_named_as_such():
    """It read "tensor must be contiguous", which a sparse tensor cannot be made."""
    from drafter_lab.kernels.allreduce import AllReduceInputError

    with _comm("sparse") as comm:
        with pytest.raises(AllReduceInputError, match="^tensor is a Sparse tensor; the all-reduce sums dense"):
            comm.all_reduce(torch.ones(8).to_sparse())
        x = torch.arange(8.0)
        assert torch.equal(comm.all_reduce(x), torch.arange(8.0))  # still usable


@pytest.mark.parametrize("clone", [pickle.dumps, copy.copy, copy.deepcopy], ids=["pickle", "copy", "deepcopy"])
def test_a_communicator_is_neither_pickled_nor_copied(clone):
    """copy.copy shared the native seat, so closing the copy closed the original; pickling raised a
    bare TypeError about the native class."""
    from drafter_lab.kernels.allreduce import AllReduceError

    with _comm("clone") as comm:
        with pytest.raises(AllReduceError, match="create one in each process"):
            clone(comm)
        assert comm.rank == 0  # the original is untouched


def test_check_on_a_closed_communicator_says_it_is_closed():
    """check() returned silently after close, reading nothing, where every property raises."""
    from drafter_lab.kernels.allreduce import AllReduceError

    comm = _comm("check")
    comm.check()
    comm.close()
    with pytest.raises(AllReduceError, match="^this communicator is closed$"):
        comm.check()
