"""A transfer between drafters whose attention splits into other heads: the widths can agree (8 heads
of 8 against 4 of 16), and the weights were copied cut into the wrong heads."""

from __future__ import annotations

import dataclasses

import pytest

from drafter_lab.drafter import formats
from drafter_lab.drafter.transfer import init_from
from drafter_lab.errors import LabError

from .test_transfer import USED_NEW, fresh, source, target_head, vocab


@pytest.mark.parametrize("other", [dict(num_attention_heads=2, head_dim=32),  # q/o widths agree
                                   dict(num_key_value_heads=4, head_dim=8, num_attention_heads=8),  # all agree
                                   dict(num_key_value_heads=1)])  # k/v narrower: was a shape error
def test_another_head_layout_is_refused_naming_both(tmp_path, other):
    src, path = source(tmp_path, formats.SGLANG)
    with pytest.raises(LabError, match=r"attention is 4 heads \(2 kv\) of 16, this one's"):
        init_from(fresh(dataclasses.replace(src.config, **other)), path, target_head(), vocab(USED_NEW))
