"""Mutation audit (review s65) of `bench verify`: the median leaves out exactly the warm-up passes,
and the fit's worst error is relative to each pass."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.spec import bench_verify
from drafter_lab.spec.bench_verify import fit_verify, median_ms


class _Clock:
    """perf_counter that advances only as the timed function says."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("reps, warmup, took, want_ms", [
    (1, 0, [0.004], 4.0),  # --reps 1 (allowed) times the one pass
    (3, 2, [9.0, 9.0, 0.001, 0.003, 0.002], 2.0),  # the slow warm-ups are no part of the median
])
def test_the_median_is_of_the_passes_after_the_warm_up(monkeypatch, reps, warmup, took, want_ms):
    clock, calls, after = _Clock(), iter(took), []
    monkeypatch.setattr(bench_verify.time, "perf_counter", clock)

    def fn():
        clock.now += next(calls)

    ms = median_ms(fn, lambda: after.append(clock.now), torch.device("cpu"), reps, warmup)
    assert ms == pytest.approx(want_ms)
    assert len(after) == reps + warmup  # the cache rolled back after every pass, warm-ups included


def test_the_fits_worst_error_is_relative_to_the_pass():
    """ms = 1/3 + n through (1, 1), (2, 3), (3, 3): off by 1/3 of 1 ms at n = 1 (the worst relative
    error), by 2/3 of 3 ms at n = 2 (the worst absolute one)."""
    a, slope, worst = fit_verify({1: {1: 1.0, 2: 3.0, 3: 3.0}})
    assert (a, slope, worst) == pytest.approx((1 / 3, 1.0, 1 / 3))


def test_the_draft_extend_counts_toward_the_targets_positions(random_llama, tmp_path, capsys):
    """With --drafter the extend runs --extend-tokens past the context: refused (before the drafter
    loads) where they pass the target's positions, as the verify's tokens are."""
    from drafter_lab.cli import main

    argv = ["bench", "verify", "--target", str(random_llama), "--drafter", str(tmp_path / "drafter"),
            "--context", "1018", "--tokens", "2", "--extend-tokens", "10"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"error: {random_llama}: --context 1018 plus 10 tokens is 1028 positions, "
                                       "past the target's max_position_embeddings 1024\n")


def test_a_pass_that_ends_at_the_last_position_is_benched(random_llama, tmp_path, capsys):
    """1018 + 6 = 1024 positions is every position the target has, not past them; one rep is enough.
    The fit is written under its names and printed with its worst error in percent."""
    import json

    from drafter_lab.cli import main

    out = tmp_path / "verify.json"
    assert main(["bench", "verify", "--target", str(random_llama), "--context", "1018", "--tokens", "6",
                 "--batch", "1", "--reps", "1", "--warmup", "0", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["meta"]["threads"] == torch.get_num_threads() >= 1  # --threads 0: torch's default, as it ran
    table = {int(b): {int(t): ms for t, ms in row.items()} for b, row in r["verify_ms_by_tokens"].items()}
    a, slope, worst = fit_verify(table)
    assert r["meta"]["fit"] == {"ms_at_zero_tokens": a, "ms_per_token": slope, "worst_relative_error": worst}
    assert f"fit: ms = {a:.3f} + {slope:.4f} x (B x T), worst error {100 * worst:.0f} %;" in capsys.readouterr().out


def test_cuda_without_a_cuda_device_is_refused(monkeypatch):
    monkeypatch.setattr(bench_verify.torch.cuda, "is_available", lambda: False)
    with pytest.raises(LabError, match="^--device cuda: no CUDA device is visible$"):
        bench_verify.parse(["--target", "t", "--device", "cuda"])


def test_the_per_token_cost_is_given_per_layer():
    """costmodel --verify-token-compute-us prices each layer: a pass 0.016 ms slower per token over 8
    layers is 2 us per layer."""
    text = bench_verify.format_table({1: {1: 3.0, 2: 3.016}}, {}, {}, (2.984, 0.016, 0.0), 8)
    assert "per layer 2.00 us per further token (costmodel --verify-token-compute-us)" in text


def test_a_seed_torch_cannot_take_is_refused_before_the_target_loads():
    with pytest.raises(LabError, match=r"^--seed must be in -2\*\*63\.\.2\*\*64-1 .*got 18446744073709551616$"):
        bench_verify.parse(["--target", "missing", "--seed", str(2**64)])


def test_every_timed_verify_starts_from_the_same_context(random_llama, monkeypatch):
    """The cache is rolled back after each pass: every pass (warm-ups included) verifies its tokens
    after exactly --context committed ones, not after the tokens of the passes before it."""
    from types import SimpleNamespace

    from drafter_lab.spec.target import TargetRunner
    from drafter_lab.targets.hf import load_target

    seen, verify = [], TargetRunner.verify

    def recording(self, *a, **k):
        seen.append((self.cache.get_seq_length(), self.lens.tolist()))
        return verify(self, *a, **k)

    monkeypatch.setattr(TargetRunner, "verify", recording)
    target = load_target(random_llama, device="cpu", dtype=torch.float32, tokenizer=False)
    args = SimpleNamespace(context=8, reps=3, warmup=1)
    bench_verify.time_verify(target, [], 2, 3, args, torch.Generator().manual_seed(0))
    assert seen == [(8, [8, 8])] * 4


def test_the_worst_error_is_printed_in_percent():
    text = bench_verify.format_table({1: {1: 3.0, 2: 3.016}}, {}, {}, (2.984, 0.016, 0.25), 8)
    assert "worst error 25 %;" in text


def test_the_passes_run_on_the_threads_asked_for(random_llama, tmp_path):
    """--threads sets torch's threads for the passes, and the file records them (one more than torch's
    default, which the passes would otherwise run on)."""
    import json

    from drafter_lab.cli import main

    kept, out = torch.get_num_threads(), tmp_path / "verify.json"
    try:
        assert main(["bench", "verify", "--target", str(random_llama), "--context", "8", "--tokens", "2",
                     "--batch", "1", "--reps", "1", "--warmup", "0", "--threads", str(kept + 1), "--json", str(out)]) == 0
        assert json.loads(out.read_text())["meta"]["threads"] == kept + 1
    finally:
        torch.set_num_threads(kept)
