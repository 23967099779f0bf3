"""A target preset's drift window of one token has no next token to predict: refused when the preset is
made, where the drift measurement divided by zero after base had trained."""

from __future__ import annotations

import pytest

from drafter_lab.errors import LabError
from drafter_lab.targets.presets import TargetConfig


def test_a_one_token_window_is_refused():
    with pytest.raises(LabError, match=r"^seq_len must be >= 2 \(a window needs a next token to predict\), got 1$"):
        TargetConfig(seq_len=1)
    assert TargetConfig(seq_len=2).seq_len == 2
