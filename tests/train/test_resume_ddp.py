"""Real processes: SIGKILL mid-epoch + --resume equals an uninterrupted run, under torchrun DDP too; torchrun
DDP (with gradient accumulation too) equals 1 process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from drafter_lab.data.shards import Manifest
from drafter_lab.train import state
from drafter_lab.train.metrics_log import read_metrics

ARGS = ["--draft-vocab-size", "128", "--epochs", "2", "--batch-size", "4", "--ttt-steps", "3", "--lr", "3e-3",
        "--warmup-steps", "3", "--eval-every", "4", "--log-every", "1", "--threads", "1"]
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "drafter_lab")


def env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}


def cli(target, data, out, *extra, launcher=(sys.executable, "-m", "drafter_lab")):
    """`data` is a feature directory, or ("--conversations", file) for an online run."""
    data = ("--data", str(data)) if not isinstance(data, tuple) else data
    cmd = [*launcher, "train", "--target", str(target), *data, "--out", str(out), *ARGS, *extra]
    return subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return out


def kill_at_first_state(proc, out) -> dict:
    """SIGKILL the run once it has written a train state, torchrun's workers (each in a session of its
    own) before torchrun; returns that state."""
    path = state.state_path(out)
    deadline = time.time() + 240
    while not path.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    if proc.poll() is None:
        workers = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        for pid in [*map(int, workers), proc.pid]:
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    return state.load(out)


def data_args(features, online: bool):
    """The captured features, or for an online run their conversations with the same split and length."""
    if not online:
        return features
    source = Manifest.load(features).source
    return ("--conversations", source["conversations"], "--val-fraction", str(source["val_fraction"]),
            "--max-length", str(source["max_length"]))


def rows(out_dir):
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in read_metrics(out_dir)]


@pytest.mark.slow
@pytest.mark.parametrize("online", [False, True], ids=["captured", "online"])
def test_sigkill_mid_epoch_then_resume_equals_uninterrupted(peaked_llama, features, tmp_path, online):
    features = data_args(features, online)
    full = cli(peaked_llama, features, tmp_path / "full", "--checkpoint-every", "2")
    killed = cli(peaked_llama, features, tmp_path / "killed", "--checkpoint-every", "2")
    saved = kill_at_first_state(killed, tmp_path / "killed")
    assert saved["epoch"] == 0 and 0 < saved["cursor"], "the kill must land mid-epoch"
    finish(cli(peaked_llama, features, tmp_path / "killed", "--checkpoint-every", "2", "--resume"))
    finish(full)

    a, b = rows(tmp_path / "full"), rows(tmp_path / "killed")
    assert a == b  # every train and val line, metrics included, identical on CPU
    assert [r for r in a if r["split"] == "val"][-1]["step"] == a[-1]["step"]
    wa, wb = load_file(str(tmp_path / "full/model.safetensors")), load_file(str(tmp_path / "killed/model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
@pytest.mark.parametrize("online", [False, True], ids=["captured", "online"])
def test_torchrun_two_processes_match_one(peaked_llama, features, tmp_path, online):
    features = data_args(features, online)  # online: each rank's target computes its rows of a batch
    parts = () if online else ("--accumulation-steps", "2")  # captured: each rank's rows one at a time
    ddp = cli(peaked_llama, features, tmp_path / "ddp", *parts, launcher=TORCHRUN)
    one = cli(peaked_llama, features, tmp_path / "one")
    finish(ddp)
    finish(one)
    a = [r for r in rows(tmp_path / "one") if r["split"] == "val"]
    b = [r for r in rows(tmp_path / "ddp") if r["split"] == "val"]
    assert [r["step"] for r in a] == [r["step"] for r in b]  # one writer: no line twice
    for k in ("loss_0", "loss_1", "loss_2"):
        assert b[-1][k] == pytest.approx(a[-1][k], rel=1e-3), k
    for k in ("cond_acc_0", "cond_acc_1", "acc_2", "simulated_accept_len"):
        assert b[-1][k] == pytest.approx(a[-1][k], abs=0.02), k
    assert b[-1]["positions"] == a[-1]["positions"]
    wa, wb = load_file(str(tmp_path / "one/model.safetensors")), load_file(str(tmp_path / "ddp/model.safetensors"))
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-3, atol=1e-4)


@pytest.mark.slow
def test_torchrun_sigkill_then_resume_equals_uninterrupted(peaked_llama, features, tmp_path):
    """Killed between two train lines, a DDP run keeps every rank's counts since the last one: the
    first line after --resume sums the whole batch of each step, as the uninterrupted run's does."""
    every = ("--epochs", "1", "--checkpoint-every", "3", "--log-every", "4")  # states at steps 3 and 6
    full = cli(peaked_llama, features, tmp_path / "full", *every, launcher=TORCHRUN)
    killed = cli(peaked_llama, features, tmp_path / "killed", *every, launcher=TORCHRUN)
    saved = kill_at_first_state(killed, tmp_path / "killed")
    assert saved["step"] % 4 and saved["cursor"], "the kill must land between two train lines"
    finish(cli(peaked_llama, features, tmp_path / "killed", *every, "--resume", launcher=TORCHRUN))
    finish(full)
    assert rows(tmp_path / "full") == rows(tmp_path / "killed")
    wa, wb = load_file(str(tmp_path / "full/model.safetensors")), load_file(str(tmp_path / "killed/model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
