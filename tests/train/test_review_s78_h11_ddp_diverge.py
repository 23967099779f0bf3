"""Real processes, 2 gloo ranks under torchrun: a run whose loss turns non-finite on rank 1 alone, after a
checkpoint, stops on both ranks at that step with the one-line error, keeps the last finite checkpoint,
and --resume goes on from it (diverging again while the bad row is there, training on once it is gone)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from drafter_lab.data.shards import FeatureSet
from drafter_lab.train import state
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.data import plan_epoch, shard_batch

from .test_resume_ddp import TORCHRUN, cli, rows
from .two_ranks import run_two_ranks

BAD_STEP, KEPT = 5, 4  # checkpoints at steps 2 and 4; rank 1's loss turns non-finite at step 5
EXTRA = ("--epochs", "1", "--max-steps", "6", "--checkpoint-every", "2", "--eval-every", "0")


def poison_rank_1_row(data, step: int) -> tuple[Path, bytes]:
    """Rewrites, in the copied features `data`, the aux hidden states of one row that rank 1 alone reads, at
    `step` (1-based) and at no step before it, to float32's largest finite value: the scan and the reader
    let it through (it is finite), and the drafter's first layer overflows on it. Returns that shard and
    its original bytes."""
    refs = FeatureSet(data).index("train")
    cfg = TrainConfig()
    lengths = [min(r.end - r.start, cfg.max_length) for r in refs]
    assert min(lengths) >= 3  # every sequence is an example: row i is refs[i]
    batches = plan_epoch(lengths, 4, cfg.batch_tokens, cfg.seed, 0)  # --batch-size 4 (ARGS), epoch 0
    row = shard_batch(batches[step - 1], 1, 2)[0]
    assert row not in shard_batch(batches[step - 1], 0, 2)
    assert all(row not in b for b in batches[:step - 1])  # an epoch reads each row once
    ref = refs[row]
    before = ref.shard.read_bytes()
    with safe_open(str(ref.shard), framework="pt") as f:
        meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    t["aux_hidden"][ref.start:ref.end] = torch.finfo(t["aux_hidden"].dtype).max
    save_file(t, str(ref.shard), metadata=meta)
    return ref.shard, before


def ends(proc, timeout: float = 180) -> tuple[int, str]:
    """torchrun's exit status and stderr; a run still going after `timeout` (a rank left waiting in a
    collective) is killed, its workers first, and fails the test."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        workers = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        for pid in [*map(int, workers), proc.pid]:
            os.kill(pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"the run still went on after {timeout}s: a rank hangs") from None
    return proc.returncode, err


def _finite(out) -> None:
    """Every weight in the run directory, and the train state's, is finite."""
    for path in out.rglob("*.safetensors"):
        assert all(t.isfinite().all() for t in load_file(str(path)).values()), path
    assert all(t.isfinite().all() for t in state.load(out)["model"].values())


def train_steps(out) -> list[int]:
    return [r["step"] for r in rows(out) if r["event"] == "train"]


@pytest.mark.slow
def test_one_rank_diverging_stops_both_at_its_step_and_keeps_the_last_checkpoint(peaked_llama, features, tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    shutil.copytree(features, data)
    shard, clean = poison_rank_1_row(data, BAD_STEP)
    # Rank 0's loss stays finite; the all-reduce spreads rank 1's NaN to its gradient norm: the loss is named.
    # No line end in the pattern: both ranks print to torchrun's stderr, and print() writes a line's end apart
    # from its text, so the other rank's line may come between.
    line = re.compile(rf"error: {re.escape(str(out))}: loss is nan at step {BAD_STEP}: the run "
                      rf"diverged \(lower --lr\); the last checkpoint, step {KEPT}, is kept")
    for again in ((), ("--resume",)):  # the resume starts from the kept step and meets the same row
        code, err = ends(cli(peaked_llama, data, out, *EXTRA, *again, launcher=TORCHRUN))
        assert code != 0
        said = line.findall(err)
        assert len(said) == 2 and said[0] == said[1], err[-3000:]  # each rank raised it itself, the same line
        assert state.load(out)["step"] == KEPT
        _finite(out)
        assert train_steps(out) == list(range(1, KEPT + 1))  # no line of the diverged step

    shard.write_bytes(clean)  # the bad row gone: --resume trains on from the kept step
    code, err = ends(cli(peaked_llama, data, out, *EXTRA, "--resume", launcher=TORCHRUN))
    assert code == 0, err[-3000:]
    assert state.load(out)["step"] == 6
    _finite(out)
    assert train_steps(out) == list(range(1, 7))


TIED = """
import math

# What the run above leaves: rank 1's loss is nan at step 5, and the all-reduce makes rank 0's gradient norm nan there too.
seen = [[5, 1.25, math.nan], [5, math.nan, math.nan]][rank]
fields = dict(out_dir=Path(args[0]), kept_step=4, cfg=types.SimpleNamespace(grad_clip=1.0),
              nonfinite=torch.tensor(seen, dtype=torch.float64))
"""


def test_a_nan_loss_on_one_rank_is_named_as_one_process_names_it(tmp_path):
    """Two ranks first non-finite at one step, as DDP's all-reduce makes it: the lowest rank's row was taken,
    so rank 1's NaN loss was reported as rank 0's "gradient norm is nan"."""
    done = run_two_ranks(tmp_path, TIED, "check_finite", tmp_path)
    assert [code for code, _, _ in done] == [2, 2], [err[-2000:] for _, _, err in done]
    line = (f"error: {tmp_path}: loss is nan at step 5: the run diverged (lower --lr); "
            "the last checkpoint, step 4, is kept\n")
    assert [out for _, out, _ in done] == [line, line]
