"""Review of session 76 (lead): a max_bytes or blocks that is no whole number in range is one line, as
every other setting; before, a float or a number past 64 bits was pybind's multi-line TypeError, and
max_bytes=2**62 wrapped around in the segment's size arithmetic."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from drafter_lab.kernels.allreduce import MAX_BYTES_LIMIT, AllReduceInputError, Communicator


@pytest.mark.parametrize(("kw", "said"), [
    ({"max_bytes": 2.5}, "max_bytes must be a whole number in 1..1099511627776, got 2.5"),
    ({"max_bytes": True}, "max_bytes must be a whole number in 1..1099511627776, got True"),
    ({"max_bytes": 2**62}, f"max_bytes must be a whole number in 1..1099511627776, got {2**62}"),
    ({"max_bytes": 2**63}, f"max_bytes must be a whole number in 1..1099511627776, got {2**63}"),
    ({"blocks": 2.5}, "blocks must be a whole number in 1..64, got 2.5"),
    ({"blocks": "4"}, "blocks must be a whole number in 1..64, got '4'"),
])
def test_a_size_that_is_no_whole_number_in_range_is_one_line(kw, said):
    with pytest.raises(AllReduceInputError) as e:
        Communicator(0, 1, name=f"s76-{os.getpid()}", one_shot_max_bytes=0, **kw)
    assert str(e.value) == said


def test_the_limit_and_a_numpy_integer_are_taken():
    assert MAX_BYTES_LIMIT == 1 << 40
    with Communicator(0, 1, name=f"s76-np-{os.getpid()}", one_shot_max_bytes=0,
                      max_bytes=np.int64(8192), blocks=np.int32(2)) as comm:
        assert comm.capacity == 8192  # a whole page
        x = torch.randn(5)
        assert torch.equal(comm.all_reduce(x.clone()), x)
