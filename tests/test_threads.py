import pytest
import torch

from drafter_lab.threads import torch_threads


def test_torch_threads_are_scoped_and_restored_on_error():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(1):
        raise RuntimeError("stage failed")
    assert torch.get_num_threads() == before
    with torch_threads(0):  # 0 leaves the count alone
        assert torch.get_num_threads() == before
