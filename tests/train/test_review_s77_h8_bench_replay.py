"""Mutation audit (review s77 h8): `bench replay`'s documented defaults, and its agreement check is relative
only: a fast path off by less than one verify step is refused all the same."""

from __future__ import annotations

import torch

from drafter_lab.cli import main
from drafter_lab.train import bench_replay
from drafter_lab.train.ttt import replay_roots


def test_the_defaults_are_the_ones_the_module_doc_names():
    args = bench_replay.parse(["--device", "cpu"])
    assert args.steps == 7 and args.reps == 9 and args.seed == 0
    assert args.shapes == [(1, 2048), (8, 2048), (1, 8192)]
    assert "--steps 7" in bench_replay.__doc__ and "--shapes 1x2048,8x2048,1x8192" in bench_replay.__doc__


def test_the_table_has_its_markdown_header(monkeypatch, capsys):
    monkeypatch.setattr(bench_replay, "median_ms", lambda fn, inputs, reps, device: 1.0)
    assert main(["bench", "replay", "--steps", "2", "--shapes", "1x16", "--reps", "1", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    i = lines.index("| rows x positions | position loop | blocks | speedup |")
    assert lines[i + 1:i + 3] == ["|---|---|---|---|", "| 1 x 16 | 1.00 | 1.00 | 1.0x |"]


def test_a_fast_path_half_a_verify_step_off_is_refused(monkeypatch, capsys):
    """About 20 expected verify steps at 1x50: an absolute tolerance of one step, or a relative one of 100%,
    would let 0.5 through."""
    def half_a_step_off(rates, mask):
        tokens, cycles = replay_roots(rates, mask)
        return tokens, cycles + 0.5

    monkeypatch.setattr(bench_replay, "replay_roots", half_a_step_off)
    assert main(["bench", "replay", "--steps", "2", "--shapes", "1x50", "--reps", "1", "--device", "cpu"]) == 2
    assert "disagrees with the position loop at 1x50" in capsys.readouterr().err


def test_the_timed_batch_is_a_prompt_then_answer_tokens_with_gaps(monkeypatch):
    """The module doc's workload: the first fifth of each row masked out, then about 90% of tokens in the loss."""
    seen = []

    def recorded(rates, mask):
        seen.append((rates, mask))
        return replay_roots(rates, mask)

    monkeypatch.setattr(bench_replay, "replay_roots", recorded)
    monkeypatch.setattr(bench_replay, "median_ms", lambda fn, inputs, reps, device: 1.0)
    assert main(["bench", "replay", "--steps", "3", "--shapes", "2x1000", "--reps", "1", "--device", "cpu"]) == 0
    (rates, mask), = seen
    assert rates.shape == (3, 2, 1000) and rates.dtype == torch.float64 and mask.shape == (2, 1000)
    assert not mask[:, :200].any()
    assert 0.85 < mask[:, 200:].double().mean() < 0.95
