"""Real processes, 2 gloo ranks under torchrun: several runs in one process (the probe's pilot arms, the
study's) share one process group; a teardown and a second rendezvous on torchrun's store hung at times."""

from __future__ import annotations

import subprocess
import sys

import pytest

from drafter_lab.train.metrics_log import read_metrics

from .test_resume_ddp import env

SCRIPT = """
import sys

import torch.distributed as dist

from drafter_lab.train import distributed
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train

target, data, out = sys.argv[1:]
cfg = TrainConfig(draft_vocab_size=128, max_steps=2, epochs=2, batch_size=4, ttt_steps=2, warmup_steps=1,
                  eval_every=2, threads=1, device="cpu")
groups = []
for arm in range(4):
    train(cfg, target, data, f"{out}/arm{arm}")
    assert dist.is_initialized(), f"arm {arm} left no process group"
    groups.append(dist.group.WORLD)
assert all(g is groups[0] for g in groups), "a run made a group of its own"
distributed.end_process(0)  # as the CLI ends a rank (gloo's threads outlive the group under DDP)
"""


@pytest.mark.slow
def test_runs_in_one_torchrun_process_share_its_process_group(peaked_llama, features, tmp_path):
    script = tmp_path / "arms.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
           str(peaked_llama), str(features), str(tmp_path / "out")]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for arm in range(4):
        assert read_metrics(tmp_path / "out" / f"arm{arm}")[-1]["step"] == 2
