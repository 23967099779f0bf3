"""Review s72 (h6), from mutation testing of `fold` and `on_allreduce`: what an input does not measure is left as
the config had it, and a measured verify is split at its all-reduces down to any compute above none."""

from __future__ import annotations

import dataclasses

import pytest

from drafter_lab.errors import LabError
from drafter_lab.spec.costinputs import fold
from drafter_lab.spec.costmodel import PRESETS, on_allreduce

SEEDS = PRESETS["seeds-kimi-k2.5-8x-pcie"]


def test_an_input_without_accept_lengths_leaves_the_configs_columns_in_their_order(tmp_path):
    """Only measured accept lengths merge into (sorted) columns: a decode time alone keeps a caller's 3 before 2."""
    cfg = dataclasses.replace(SEEDS, accept_lengths=[3.0, 2.0])
    assert fold(cfg, {"decode_ms": 9.0}, tmp_path)[0].accept_lengths == [3.0, 2.0]
    assert fold(cfg, {"accept_length": 2.5}, tmp_path)[0].accept_lengths == [2.0, 2.5, 3.0]


def test_a_measured_verify_leaving_under_a_microsecond_of_compute_a_layer_is_split_not_refused():
    """2 layers of 2 all-reduces at 25 us leave 1 us of a 101 us verify: 0.5 us a layer, small but no less than
    nothing (only none or less is refused)."""
    cfg = dataclasses.replace(SEEDS, num_layers=2, allreduces_per_layer=2, measured_verify_ms=0.101)
    split = on_allreduce(cfg, 25.0)
    assert split.verify_layer_compute_us == pytest.approx(0.5)
    assert split.measured_verify_ms == 0.0
    with pytest.raises(LabError, match="^the measured verify_ms 0.1 is shorter than its 4 all-reduces of 25 us"):
        on_allreduce(dataclasses.replace(cfg, measured_verify_ms=0.1), 25.0)
