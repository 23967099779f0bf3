"""Capture under torchrun with transformers' tensor-parallel loading (2 CPU ranks, gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from data_helpers import PREPARE_ARGS

from drafter_lab.data.shards import FeatureSet

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tensor_parallel_capture_matches_one_process(features, random_llama, conversations_file, tmp_path):
    pytest.importorskip("accelerate", reason="transformers loads tp_plan='auto' only with `accelerate` installed")
    out = tmp_path / "feat"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "drafter_lab", "data", "prepare", "--target", str(random_llama),
         "--conversations", str(conversations_file), "--out", str(out), *PREPARE_ARGS],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("features in") == 1  # rank 0 alone reports
    one, tp = FeatureSet(features), FeatureSet(out)
    assert tp.manifest.shards.keys() == one.manifest.shards.keys()
    for split in ("train", "val"):
        assert tp.manifest.counts(split) == one.manifest.counts(split)
        for a, b in zip(one.sequences(split), tp.sequences(split), strict=True):
            assert a.seq_id == b.seq_id and torch.equal(a.input_ids, b.input_ids)
            torch.testing.assert_close(b.aux_hidden, a.aux_hidden, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(b.final_hidden, a.final_hidden, rtol=1e-5, atol=1e-5)
