"""Mutation audit (review s77 h8): `replay_roots` does one triangular solve per `block` positions (32 by
default), the op count its docstring promises, and still equals the position loop."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.train.ttt import replay_roots, replay_roots_reference


@pytest.mark.parametrize("T, block, solves", [(97, None, 4), (64, None, 2), (65, 32, 3), (7, 3, 3), (5, 8, 1)])
def test_one_triangular_solve_per_block_of_positions(T, block, solves, monkeypatch):
    calls = []
    solve = torch.linalg.solve_triangular

    def counted(*args, **kwargs):
        calls.append(1)
        return solve(*args, **kwargs)

    monkeypatch.setattr(torch.linalg, "solve_triangular", counted)
    g = torch.Generator().manual_seed(T)
    rates = torch.rand(3, 2, T, dtype=torch.float64, generator=g)
    mask = torch.rand(2, T, generator=g) < 0.8
    got = replay_roots(rates, mask) if block is None else replay_roots(rates, mask, block)
    assert len(calls) == solves
    torch.testing.assert_close(got, replay_roots_reference(rates, mask), rtol=1e-12, atol=1e-12)
