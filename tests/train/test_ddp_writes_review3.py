"""The rank-0-only writes: a run's first files (or its resume's tidying), a train line, a validation's
metrics line or kept drafter, or a checkpoint, that rank 0 cannot write (disk full) fail every rank with one line. Rank 0 raised the
OSError's traceback alone, and the other ranks waited in the next collective (gloo: for ever)."""

from __future__ import annotations

import dataclasses

import pytest

from drafter_lab.errors import LabError
from drafter_lab.train import loop, state
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics_log import MetricsLog

from .two_ranks import run_two_ranks

FULL = """
import errno

import drafter_lab.train.loop as loop
from drafter_lab.train.metrics_log import MetricsLog

out = Path(args[0])
out.mkdir(exist_ok=True)

def full(*_, **__):
    raise OSError(errno.ENOSPC, "No space left on device")

loop.save_drafter = lambda *_: None  # the stub has no drafter to write
if rank == 0 and args[1] != "none":
    setattr(*{"metrics": (MetricsLog, "write"), "best": (loop, "save_drafter"),
              "state": (loop.state, "save"), "drafter": (loop, "save_drafter"),
              "run.json": (loop.atomic, "write_json"), "train line": (MetricsLog, "write"),
              "truncate": (MetricsLog, "truncate")}[args[1]], full)
loop.summarize = lambda *_: {"loss_0": 1.0}
loop.eval_counts = loop.weighted_loss = lambda *_: None
fields = dict(
    out_dir=out, step=7, epoch=0, tokens=70, total=10, t0=0.0, tb=None, watch=None, replay=False, best=None,
    cfg=types.SimpleNamespace(lr=1e-3, warmup_steps=0, min_lr_ratio=0.0, ttt_steps=1, loss_decay=1.0,
                              val_temperature=0.0, eval_batch_size=1, keep_best="loss_0" if args[1] == "best" else ""),
    metrics=MetricsLog(out / "metrics.jsonl", enabled=rank == 0), info={}, obj=None, val_ex=None, autocast=None,
    drafter=types.SimpleNamespace(eval=lambda: None, train=lambda: None), log_counts=torch.zeros(2),
    check_finite=lambda: None, save_state=lambda counts: loop.state.save(out, {}), restore=lambda: None,
    last_val=None, report=None, saved=None,
)
for name in ("record", "keep_if_best", "start_files", "tidy"):  # the stub's methods: _Run's, on it
    if hasattr(_Run, name):
        fields[name] = (lambda f: lambda *a: f(run, *a))(getattr(_Run, name))
"""

CASES = [  # (the write that fails on rank 0, the method, the file named, what rank 1 says failed)
    ("metrics", "validate", "metrics.jsonl", "the validation"),
    ("best", "validate", "best", "the validation"),
    ("drafter", "checkpoint", "", "the checkpoint"),
    ("state", "checkpoint", "train_state/state.pt", "the checkpoint"),
    ("run.json", "fit", "", "starting the run"),  # fit fails before it trains: the stub has nothing to train
    ("train line", "log_train", "metrics.jsonl", "a train line"),
    ("truncate", "restore", "", "resuming the run"),
]


@pytest.mark.parametrize("write, method, file, what", CASES)
def test_a_write_rank_0_cannot_make_fails_every_rank(tmp_path, write, method, file, what):
    out = tmp_path / "out"
    (code0, out0, err0), (code1, out1, err1) = run_two_ranks(tmp_path, FULL, method, out, write)
    assert (code0, out0) == (2, f"error: {out / file if file else out}: cannot be written (No space left on device)\n"), \
        err0[-2000:]
    assert (code1, out1) == (2, f"error: {out}: {what} failed on rank 0 at step 7 (its error is in rank 0's output)\n"), \
        err1[-2000:]


def test_both_ranks_go_on_when_rank_0s_writes_succeed(tmp_path):
    out = tmp_path / "out"
    done = run_two_ranks(tmp_path, FULL, "checkpoint", out, "none")
    assert [(code, text) for code, text, _ in done] == [(0, ""), (0, "")], [err[-2000:] for *_, err in done]
    assert state.state_path(out).exists()


CFG = TrainConfig(draft_vocab_size=128, batch_size=4, max_steps=4, ttt_steps=2, warmup_steps=0, eval_every=2,
                  checkpoint_every=2, log_every=4, threads=1)


def test_a_single_process_run_fails_with_one_line_too(peaked_llama, features, tmp_path, monkeypatch):
    """Without DDP a full disk was the OSError's traceback; it is the same one line now."""
    out = tmp_path / "run"
    real = MetricsLog.write

    def full_at_val(self, record):
        if record["event"] == "val":
            raise OSError(28, "No space left on device")
        real(self, record)

    monkeypatch.setattr(MetricsLog, "write", full_at_val)
    with pytest.raises(LabError) as e:
        train(CFG, peaked_llama, features, out)
    assert str(e.value) == f"{out / 'metrics.jsonl'}: cannot be written (No space left on device)"
    monkeypatch.setattr(MetricsLog, "write", real)
    monkeypatch.setattr(loop, "save_drafter", lambda *_: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(LabError, match=r"/run2: cannot be written \(No space left on device\)$"):
        train(dataclasses.replace(CFG, eval_every=0), peaked_llama, features, tmp_path / "run2")
