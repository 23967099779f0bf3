"""Mutation audit (review s73 h9) of `bench verify`: its documented defaults, and the table it prints
with a drafter's columns."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from drafter_lab.drafter.checkpoint import save_drafter
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.spec import bench_verify


def test_the_defaults_are_the_documented_ones():
    args = bench_verify.parse(["--target", "t", "--device", "cpu"])
    assert (args.tokens, args.batch, args.context, args.extend_tokens) == ([1, 2, 4, 8, 16], [1, 4, 16], 256, 3)
    assert (args.dtype, args.threads, args.reps, args.warmup, args.seed, args.json, args.drafter) == (
        "float32", 0, 20, 3, 0, None, None)
    # --device auto is resolved here, so the refusal below and the file's meta see the device itself
    assert bench_verify.parse(["--target", "t"]).device == ("cuda" if torch.cuda.is_available() else "cpu")


def test_help_opens_with_the_docstrings_first_line(capsys):
    with pytest.raises(SystemExit):
        bench_verify.parse(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # as argparse wraps it
    assert "Benchmark: the target's verify pass against the tokens it carries, on this device." in out


def test_the_plain_decode_step_is_put_first_once():
    """T = 1 prices the baseline: added in front when missing, never twice."""
    assert bench_verify.parse(["--target", "t", "--device", "cpu", "--tokens", "4,2"]).tokens == [1, 4, 2]
    assert bench_verify.parse(["--target", "t", "--device", "cpu", "--tokens", "2,1"]).tokens == [2, 1]


def test_context_one_is_allowed():
    assert bench_verify.parse(["--target", "t", "--device", "cpu", "--context", "1"]).context == 1


def test_a_cuda_pass_is_timed_between_synchronisations(monkeypatch):
    """CUDA runs asynchronously: the clock starts after the queue drains and stops after the pass has
    run, not when it was queued; after() stays outside the timed span."""
    events, now = [], iter(range(100))

    def clock():
        events.append("clock")
        return float(next(now))

    monkeypatch.setattr(bench_verify.time, "perf_counter", clock)
    monkeypatch.setattr(bench_verify.torch.cuda, "synchronize", lambda device: events.append(f"sync {device}"))
    ms = bench_verify.median_ms(lambda: events.append("fn"), lambda: events.append("after"), torch.device("cuda"), 1, 1)
    once = ["sync cuda", "clock", "fn", "sync cuda"]
    assert events == [*once, "after", *once, "clock", "after"]  # the warm-up reads the clock once, untimed
    assert ms == 1000.0  # clock 1 to 2 in the timed pass


def test_a_verify_pass_carries_its_tokens_after_the_context(random_llama, monkeypatch):
    """Each timed verify has `tokens` nodes per row (a chain), and its commit keeps none of them."""
    from drafter_lab.spec.target import TargetRunner
    from drafter_lab.targets.hf import load_target

    seen, verify, commit = [], TargetRunner.verify, TargetRunner.commit

    def verifying(self, tokens, depth, ancestors, aux):
        seen.append(("verify", tuple(tokens.shape), depth.tolist(), aux))
        return verify(self, tokens, depth, ancestors, aux)

    def committing(self, path, counts, verified):
        seen.append(("commit", counts.tolist(), verified))
        return commit(self, path, counts, verified)

    monkeypatch.setattr(TargetRunner, "verify", verifying)
    monkeypatch.setattr(TargetRunner, "commit", committing)
    target = load_target(random_llama, device="cpu", dtype=torch.float32, tokenizer=False)
    args = SimpleNamespace(context=8, reps=1, warmup=1)
    bench_verify.time_verify(target, [], 2, 3, args, torch.Generator().manual_seed(0))
    assert seen == [("verify", (2, 3), [[0, 1, 2]] * 2, False), ("commit", [0, 0], 3)] * 2


def _drafter():
    """A small random drafter that fits random_llama (hidden 64, 8 layers)."""
    cfg = DrafterConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                        draft_vocab_size=16, target_vocab_size=512, target_hidden_size=64, aux_layer_ids=[2, 4, 5])
    drafter = Eagle3Drafter(cfg)
    with torch.no_grad():  # d2t and t2d of a draft vocabulary: the first 16 target ids
        drafter.t2d[:16] = True
    return drafter


def test_the_draft_step_is_one_token_per_row_at_the_context(monkeypatch):
    """The step writes at position --context of a cache just long enough for it, top-1 as a chain drafts."""
    drafter, seen = _drafter(), []

    def step(embeds, hidden, pos, k, v, lens, topk):
        seen.append((tuple(embeds.shape), tuple(hidden.shape), pos.tolist(), k.shape[2], v.shape[2], lens.tolist(),
                     topk))
        return drafter.draft_step(embeds, hidden, pos, k, v, lens, topk)

    monkeypatch.setattr(bench_verify, "resolve_step", lambda d, fused: (step, False))
    args = SimpleNamespace(context=8, reps=2, warmup=1)
    assert bench_verify.time_draft_step(drafter, 2, args, torch.Generator().manual_seed(0)) > 0
    assert seen == [((2, 32), (2, 32), [8, 8], 9, 9, [8, 8], 1)] * 3


def test_every_draft_extend_starts_from_the_context(monkeypatch):
    """The extend runs over --extend-tokens accepted tokens per row, each pass (warm-ups included)
    after exactly --context committed ones, top-1."""
    from drafter_lab.spec.drafting import DrafterRunner

    seen, extend = [], DrafterRunner.extend

    def extending(self, ids, aux, counts, topk):
        seen.append((self.lens.tolist(), tuple(ids.shape), tuple(aux.shape), counts.tolist(), topk, self.k.shape[2]))
        return extend(self, ids, aux, counts, topk)

    monkeypatch.setattr(DrafterRunner, "extend", extending)
    args = SimpleNamespace(context=8, reps=2, warmup=1, extend_tokens=3)
    assert bench_verify.time_extend(_drafter(), 2, args, torch.Generator().manual_seed(0)) > 0
    assert seen == [([8, 8], (2, 3), (2, 3, 192), [3, 3], 1, 11)] * 3


def test_a_pass_to_the_last_position_without_a_drafter_is_benched(random_llama, tmp_path, capsys):
    """Without --drafter no extend runs: --extend-tokens takes no positions, and a decode step alone
    (T = 1) at --context 1023 ends at position 1024, the target's last."""
    import json

    from drafter_lab.cli import main

    out = tmp_path / "verify.json"
    assert main(["bench", "verify", "--target", str(random_llama), "--context", "1023", "--tokens", "1",
                 "--batch", "1", "--reps", "1", "--warmup", "0", "--json", str(out)]) == 0
    assert set(json.loads(out.read_text())["verify_ms_by_tokens"]["1"]) == {"1"}


def test_progress_counts_every_point(random_llama, tmp_path, capsys):
    """The bar's total is every (batch, tokens) pass plus, with a drafter, its two timings per batch,
    and the work reaches it exactly."""
    from drafter_lab.cli import main

    drafter = tmp_path / "drafter"
    save_drafter(_drafter(), drafter)
    assert main(["bench", "verify", "--target", str(random_llama), "--drafter", str(drafter), "--context", "8",
                 "--tokens", "2", "--batch", "1,2", "--reps", "1", "--warmup", "0"]) == 0
    counts = re.findall(r"^bench verify \(batch x tokens\) (\d+)/(\d+)", capsys.readouterr().err, re.M)
    assert counts and counts[-1] == ("8", "8") and all(total == "8" for _, total in counts)  # 2 x (2 tokens + 2)


def test_the_table_with_a_drafter_gives_its_columns_per_batch():
    table = {1: {1: 2.0, 2: 2.5}, 4: {1: 3.0, 2: 4.25}}
    text = bench_verify.format_table(table, {1: 120.4, 4: 130.6}, {1: 200.0, 4: 260.0}, None, 8)
    assert text.splitlines()[1:5] == [
        "batch |      T=1      T=2 | draft step us extend us",
        "-" * 51,
        "    1 |    2.000    2.500 |           120       200",
        "    4 |    3.000    4.250 |           131       260",
    ]
    plain = bench_verify.format_table(table, {}, {}, None, 8).splitlines()
    assert plain[1:4] == ["batch |      T=1      T=2", "-" * 25, "    1 |    2.000    2.500"]


@pytest.mark.parametrize("slope, layers, worst, want", [
    (0.3, 8, 0.6, "worst error 60 %; per layer 37.50 us per further token"),
    (0.0, 8, 0.0, "worst error 0 %; per layer 0.00 us per further token"),  # flat: a cost of 0, not noise
])
def test_the_fit_line_in_figures(slope, layers, worst, want):
    text = bench_verify.format_table({1: {1: 1.0, 2: 1.0}}, {}, {}, (1.0, slope, worst), layers)
    assert want in text.splitlines()[-1]


def test_auto_takes_cuda_where_it_is_visible(monkeypatch):
    monkeypatch.setattr(bench_verify.torch.cuda, "is_available", lambda: True)
    assert bench_verify.parse(["--target", "t"]).device == "cuda"


def test_the_drafters_timings_are_in_microseconds(monkeypatch):
    """A median of 0.25 ms is 250 us, for the step and the extend alike."""
    monkeypatch.setattr(bench_verify, "median_ms", lambda *_: 0.25)
    args, gen = SimpleNamespace(context=8, reps=1, warmup=0, extend_tokens=3), torch.Generator().manual_seed(0)
    assert bench_verify.time_draft_step(_drafter(), 2, args, gen) == bench_verify.time_extend(_drafter(), 2, args, gen) == 250.0
