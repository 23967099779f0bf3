"""Gradient accumulation: a step run as micro-batches computes the gradient of the whole batch."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from drafter_lab.cli import main
from drafter_lab.train import loop
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.data import collate, micro_batches
from drafter_lab.train.loop import train
from drafter_lab.train.metrics_log import read_metrics

CFG = TrainConfig(draft_vocab_size=128, batch_size=8, max_steps=3, ttt_steps=3, warmup_steps=0, eval_every=0,
                  log_every=1, threads=1)


def test_micro_batches_cut_in_order_with_the_smallest_largest_part():
    rows = list(range(8))
    even = [100] * 8
    assert micro_batches(rows, even, 1) == [rows]
    assert micro_batches(rows, even, 3) == [rows[:3], rows[3:6], rows[6:]]
    assert micro_batches(rows, even, 8) == micro_batches(rows, even, 20) == [[r] for r in rows]
    # Cut by count, the long rows would pad a part of 4 x 40 = 160 tokens; cut by tokens, 2 x 40.
    assert micro_batches([0, 1, 2, 3, 4, 5], [10, 10, 10, 10, 40, 40], 2) == [[0, 1, 2, 3], [4, 5]]
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):  # against every cut into at most n parts
        m, n = int(torch.randint(1, 9, (), generator=gen)), int(torch.randint(1, 5, (), generator=gen))
        lengths = torch.randint(1, 50, (m,), generator=gen).tolist()
        rows = torch.randperm(m, generator=gen).tolist()
        parts = micro_batches(rows, lengths, n)
        assert [r for p in parts for r in p] == rows and len(parts) <= n and all(parts)
        best = min(_largest(rows, lengths, cut) for cut in itertools.product((0, 1), repeat=m - 1)
                   if sum(cut) < n)
        assert max(len(p) * max(lengths[r] for r in p) for p in parts) == best


def _largest(rows, lengths, cut) -> int:
    """Padded tokens of the largest part when rows are cut after position j where cut[j]."""
    parts, cur = [], [rows[0]]
    for r, c in zip(rows[1:], cut):
        if c:
            parts.append(cur)
            cur = []
        cur.append(r)
    parts.append(cur)
    return max(len(p) * max(lengths[r] for r in p) for p in parts)


def _run(monkeypatch, tmp_path, name, target, data, **kw):
    """Trains with plain SGD in place of AdamW (Adam's first steps are sign-like, so they would turn
    rounding into whole steps); returns each step's gradients, the batch sizes collated for training,
    and the train lines of metrics.jsonl."""
    grads, sizes = [], []

    def sgd(self, closure=None):
        with torch.no_grad():
            params = [p for g in self.param_groups for p in g["params"]]
            grads.append([p.grad.clone() for p in params])
            for p in params:
                p.add_(p.grad, alpha=-0.05)

    monkeypatch.setattr(torch.optim.AdamW, "step", sgd)
    monkeypatch.setattr(loop, "collate", lambda examples: sizes.append(len(examples)) or collate(examples))
    train(dataclasses.replace(CFG, **kw.pop("cfg", {})), target, data, tmp_path / name, **kw)
    lines = [{k: v for k, v in r.items() if k != "elapsed_s"} for r in read_metrics(tmp_path / name)
             if r["split"] == "train"]
    return grads, sizes, lines


def _assert_same_steps(a, b):
    assert len(a) == len(b) == CFG.max_steps
    for step, (ga, gb) in enumerate(zip(a, b)):
        for x, y in zip(ga, gb, strict=True):
            torch.testing.assert_close(y, x, rtol=1e-4, atol=1e-6, msg=lambda m, step=step: f"step {step}: {m}")


def test_micro_batches_add_up_to_the_whole_batchs_gradient(monkeypatch, tmp_path, peaked_llama, features):
    whole, sizes1, lines1 = _run(monkeypatch, tmp_path, "whole", peaked_llama, features)
    parts, sizes3, lines3 = _run(monkeypatch, tmp_path, "parts", peaked_llama, features,
                                 cfg={"accumulation_steps": 3})
    assert len(sizes1) == CFG.max_steps and max(sizes1) == 8
    assert CFG.max_steps < len(sizes3) <= 3 * CFG.max_steps and sum(sizes3) == sum(sizes1)  # really in parts
    _assert_same_steps(whole, parts)
    assert len(lines1) == len(lines3) == CFG.max_steps
    for a, b in zip(lines1, lines3):
        for k, v in a.items():  # counts add up exactly; the losses differ in the rounding
            assert b[k] == (pytest.approx(v, rel=1e-5) if isinstance(v, float) else v), k


def test_a_transfers_l2sp_pull_counts_once_per_step(monkeypatch, tmp_path, peaked_llama, features):
    source = tmp_path / "source"
    train(dataclasses.replace(CFG, max_steps=1), peaked_llama, features, source)
    kw = dict(init_from=source, l2sp=50.0)  # large, so that counting it three times would show
    whole, _, _ = _run(monkeypatch, tmp_path, "whole", peaked_llama, features, **kw)
    parts, _, _ = _run(monkeypatch, tmp_path, "parts", peaked_llama, features, cfg={"accumulation_steps": 3}, **kw)
    _assert_same_steps(whole, parts)


class _Killed(Exception):
    pass


def test_a_run_resumes_in_other_parts(monkeypatch, tmp_path, peaked_llama, features):
    """A run that ran out of memory continues with more accumulation steps."""
    cfg = dataclasses.replace(CFG, max_steps=4, checkpoint_every=2)
    train(cfg, peaked_llama, features, tmp_path / "full")
    real = loop._Run.checkpoint

    def checkpoint_then_die(self):
        real(self)
        raise _Killed

    with monkeypatch.context() as m:
        m.setattr(loop._Run, "checkpoint", checkpoint_then_die)
        with pytest.raises(_Killed):
            train(cfg, peaked_llama, features, tmp_path / "run")
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2]
    train(dataclasses.replace(cfg, accumulation_steps=4), peaked_llama, features, tmp_path / "run", resume=True)
    full, resumed = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "run")
    assert [r["step"] for r in resumed] == [r["step"] for r in full] == [1, 2, 3, 4, 4]
    for a, b in zip(full, resumed):
        assert b["positions"] == a["positions"]
        assert b["loss_0"] == (a["loss_0"] if a["step"] <= 2 else pytest.approx(a["loss_0"], rel=1e-3))


def test_a_bad_accumulation_is_one_line(tmp_path, peaked_llama, features, capsys):
    code = main(["train", "--target", str(peaked_llama), "--data", str(features), "--out", str(tmp_path / "bad"),
                 "--accumulation-steps", "0", "--max-steps", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "--accumulation-steps must be >= 1" in err
    assert not (tmp_path / "bad").exists()
