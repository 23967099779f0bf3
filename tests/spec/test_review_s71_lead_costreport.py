"""Review s71: beside a pass table the JSON report wrote the per-layer compute the table replaces, which
since the table prices a verify whatever those fields come to could read -18 us."""

from __future__ import annotations

import dataclasses

from drafter_lab.spec.costmodel import PRESETS
from drafter_lab.spec.costreport import report

SEEDS = PRESETS["seeds-kimi-k2.5-8x-pcie"]


def test_a_pass_table_report_writes_no_per_layer_compute():
    cfg = dataclasses.replace(SEEDS, verify_token_compute_us=1e6, pass_ms_by_tokens={1: {1: 10.0, 4: 12.0}})
    r = report(cfg, priced=False)
    assert r["layer_compute_us"] is None and r["verify_compute_ms"] == 12.0


def test_without_a_pass_table_the_report_writes_the_per_layer_compute():
    r = report(SEEDS, priced=False)
    assert r["layer_compute_us"] > 0 and r["verify_compute_ms"] * 1000 >= r["layer_compute_us"] * SEEDS.num_layers
