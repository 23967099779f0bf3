"""A state.pt that unpickles but is no train state this lab saved (another pickle, or a dict without
what a resume reads) is one line naming it, not a KeyError in the middle of the resume."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.train import state


@pytest.mark.parametrize("saved, missing", [
    ([1, 2], ", ".join(state.REQUIRED)),
    ({k: 0 for k in state.REQUIRED if k != "model"}, "model"),
])
def test_another_pickle_is_refused_naming_the_file(tmp_path, saved, missing):
    path = state.state_path(tmp_path)
    path.parent.mkdir()
    torch.save(saved, path)
    with pytest.raises(LabError, match=rf"^{path}: not a train state this lab saved \(no {missing}\)$"):
        state.load(tmp_path)


def test_a_whole_state_loads(tmp_path):
    saved = {k: k for k in state.REQUIRED}
    state.save(tmp_path, saved)
    assert state.load(tmp_path) == saved
