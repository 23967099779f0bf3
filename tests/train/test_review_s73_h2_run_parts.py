"""_Run.log_train, tidy, restore and validate's first check on a bare _Run over a real metrics.jsonl."""
from __future__ import annotations

import json
import math
import socket
import time
import types

import pytest
import torch

from drafter_lab.drafter.checkpoint import CONFIG, WEIGHTS
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.errors import LabError
from drafter_lab.train import loop, state
from drafter_lab.train.loop import _Run
from drafter_lab.train.metrics_log import BEST_DIR, METRICS, RUN_FILE, TRANSFER_FILE
from drafter_lab.train.ttt import CE_SUM, N_COLS, N_LOSS, N_VALID
from drafter_lab.train.watch import WATCH_FILE


def _bare_run(tmp_path, other_ranks: torch.Tensor | None = None) -> _Run:
    """A bare one-rank _Run at step 3; the sum adds `other_ranks`' counts where it sums a [2, N_COLS] tensor."""
    run = object.__new__(_Run)
    extra = torch.zeros(2, N_COLS, dtype=torch.float64) if other_ranks is None else other_ranks
    run.d = types.SimpleNamespace(world=1, rank=0, main=True, device=torch.device("cpu"),
                                  sum=lambda t: t + extra if t.shape == extra.shape else t)
    run.cfg = types.SimpleNamespace(ttt_steps=2, loss_decay=0.5, lr=1e-3, warmup_steps=0, min_lr_ratio=0.1,
                                    grad_clip=1.0)
    run.out_dir, run.step, run.epoch, run.tokens, run.total, run.t0, run.tb = tmp_path, 3, 0, 60, 10, 0.0, None
    run.nonfinite, run.kept_step = torch.zeros(3, dtype=torch.float64), None
    run.metrics = loop.MetricsLog(tmp_path / METRICS)
    run.log_counts = torch.zeros(2, N_COLS, dtype=torch.float64)
    return run


def _counts(ce0, ce1, n=4.0):
    c = torch.zeros(2, N_COLS, dtype=torch.float64)
    c[:, N_VALID], c[:, N_LOSS], c[0, CE_SUM], c[1, CE_SUM] = n, n, ce0, ce1
    return c


def test_a_train_line_sums_every_ranks_counts_weighs_the_steps_and_starts_the_next_from_zero(tmp_path):
    run = _bare_run(tmp_path, other_ranks=_counts(4.0, 12.0))
    run.log_counts += _counts(4.0, 4.0)  # with the other rank's: loss_0 = 8 / 8, loss_1 = 16 / 8
    m = run.log_train()
    assert (m["loss_0"], m["loss_1"], m["positions"]) == (1.0, 2.0, 8)
    assert m["weighted_loss"] == pytest.approx(1.0 + 0.5 * 2.0)
    row = json.loads((tmp_path / METRICS).read_text())
    assert (row["event"], row["step"], row["weighted_loss"]) == ("train", 3, m["weighted_loss"])
    assert not run.log_counts.any()  # the next line counts its own steps alone


def test_a_diverged_run_writes_no_train_line(tmp_path):
    run = _bare_run(tmp_path)
    run.log_counts += _counts(4.0, 4.0)
    run.nonfinite = torch.tensor([2.0, math.nan, 1.0], dtype=torch.float64)
    with pytest.raises(LabError, match="loss is nan at step 2: the run diverged"):
        run.log_train()
    assert not (tmp_path / METRICS).exists()


def _stale_temp(path):
    """The temp a writer of `path` killed on this host left (a pid no process has)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.parent / f".{path.name}.{2**22 + 1}@{socket.gethostname()}.x.tmp"
    temp.write_text("half")
    return temp


@pytest.mark.parametrize("saved, kept", [(None, ""), ({"metrics_bytes": 6}, "line1\n")])
def test_tidy_clears_killed_writers_temps_and_cuts_metrics_back_to_the_state(tmp_path, saved, kept):
    """Without a train state a killed first attempt's lines all go; with one, those after its size."""
    run = _bare_run(tmp_path)
    (tmp_path / METRICS).write_text("line1\nline2\n")
    names = (BEST_DIR, WEIGHTS, CONFIG, RUN_FILE, TRANSFER_FILE, WATCH_FILE)
    temps = [_stale_temp(p) for p in (*(tmp_path / n for n in names),
                                      state.state_path(tmp_path))]
    run.tidy(saved)
    assert (tmp_path / METRICS).read_text() == kept
    assert [t for t in temps if t.exists()] == []


def test_a_diverged_run_is_not_validated(tmp_path):
    """validate checks first: best/ and the watch never see a diverged drafter (the bare run has none to run)."""
    run = _bare_run(tmp_path)
    run.nonfinite = torch.tensor([4.0, 1.0, math.inf], dtype=torch.float64)
    with pytest.raises(LabError, match="gradient norm is inf at step 4: the run diverged"):
        run.validate()


# ---- restore ----------------------------------------------------------------------------------------

def _trainee(tmp_path, seed: int, main: bool = True) -> _Run:
    """A bare _Run with a tiny real drafter, its optimizer and schedule (each seed's weights differ)."""
    run = _bare_run(tmp_path)
    run.d.main = main
    run.cfg = types.SimpleNamespace(**vars(run.cfg), batch_size=2, batch_tokens=0, seed=0, keep_best="loss_0")
    run.lengths = [3, 4, 5, 6]
    torch.manual_seed(seed)
    run.drafter = loop.Eagle3Drafter(DrafterConfig(
        hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        draft_vocab_size=4, target_vocab_size=10, target_hidden_size=16, aux_layer_ids=[0, 1, 2]))
    run.optim = torch.optim.AdamW(run.drafter.parameters(), lr=1e-3)
    run.sched = torch.optim.lr_scheduler.LambdaLR(run.optim, lambda s: 1.0 / (s + 1))
    run.step = run.epoch = run.cursor = run.tokens = 0
    run.t0, run.last_val, run.best = time.time(), None, None
    return run


def _saved(tmp_path) -> dict:
    """The train state of a run at step 5 (epoch 1, batch 1) that took an optimizer step, 50 s in."""
    before = _trainee(tmp_path / "before", seed=1)
    for p in before.drafter.parameters():
        p.grad = torch.ones_like(p)
    before.optim.step()
    before.sched.step()
    old = torch.ones(2, N_COLS - 2, dtype=torch.float64)  # saved before the sampled columns existed
    return {"model": before.drafter.state_dict(), "optimizer": before.optim.state_dict(),
            "scheduler": before.sched.state_dict(), "step": 5, "epoch": 1, "cursor": 1, "log_counts": old,
            "last_val": {"step": 4, "loss_0": 2.0}, "metrics_bytes": 6, "elapsed_s": 50.0, "rng": state.rng_state()}


@pytest.mark.parametrize("main", [True, False])
def test_restore_takes_up_every_part_of_the_train_state(tmp_path, main):
    saved = _saved(tmp_path)
    drawn = torch.rand(3)  # the draws the resumed run makes next
    (tmp_path / METRICS).write_text("line1\nline2\n")
    (tmp_path / BEST_DIR).mkdir()
    (tmp_path / BEST_DIR / "best.json").write_text(json.dumps({"metric": "loss_0", "value": 1.5, "step": 4}))
    run = _trainee(tmp_path, seed=2, main=main)
    run.saved = saved
    run.restore()
    assert all(torch.equal(v, run.drafter.state_dict()[k]) for k, v in saved["model"].items())
    assert str(run.optim.state_dict()) == str(saved["optimizer"])
    assert run.sched.last_epoch == 1 and run.optim.param_groups[0]["lr"] == pytest.approx(5e-4)
    assert (run.step, run.epoch, run.cursor, run.kept_step) == (5, 1, 1, 5)  # kept_step: a divergence names it
    assert run.tokens == loop._tokens_before(run.cfg, run.lengths, 1, 1) > sum(run.lengths)
    # rank 0 carries every rank's counts since the last train line; the others add theirs from zero
    assert torch.equal(run.log_counts[:, :N_COLS - 2], saved["log_counts"] if main else torch.zeros(2, N_COLS - 2))
    assert not run.log_counts[:, N_COLS - 2:].any()
    assert run.last_val == {"step": 4, "loss_0": 2.0}
    assert run.best == {"metric": "loss_0", "value": 1.5, "step": 4}
    assert time.time() - run.t0 >= 50.0  # the clock goes on from the checkpoint's
    assert torch.equal(torch.rand(3), drawn)
    assert (tmp_path / METRICS).read_text() == ("line1\n" if main else "line1\nline2\n")  # rank 0 cuts it back


def test_a_state_saved_before_its_clock_was_kept_restarts_the_clock(tmp_path, monkeypatch):
    saved = _saved(tmp_path)
    del saved["elapsed_s"]
    (tmp_path / METRICS).write_text("line1\n")
    run = _trainee(tmp_path, seed=2)
    run.saved = saved
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(time=lambda: 1000.0))  # a clock that stands still
    run.restore()
    assert run.t0 == 1000.0


def test_a_line_holds_the_seconds_since_the_runs_clock_began_to_the_millisecond(tmp_path, monkeypatch):
    run = _bare_run(tmp_path)
    run.t0 = 1000.0  # a resumed run's: its checkpoint's elapsed time before now
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(time=lambda: 1012.34567))
    run.record("train", {"loss_0": 1.0})
    assert json.loads((tmp_path / METRICS).read_text())["elapsed_s"] == 12.346
