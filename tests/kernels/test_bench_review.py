"""Review of the benchmarks' CPU-reachable paths: a device they cannot use is one line, not torch's
traceback, and the draft step's floor counts the bytes the step moves."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.cli import main as cli
from drafter_lab.errors import LabError
from drafter_lab.kernels import _ext
from drafter_lab.kernels import bench_draft_forward as bdf


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built")
def test_gpu_streams_with_cuda_backends_named_but_no_gpu(no_gpu):
    """`--gpu-streams --backends cuda-host` without a GPU was a ZeroDivisionError (rank % 0 GPUs)."""
    from drafter_lab.kernels.bench_allreduce import main

    with pytest.raises(LabError, match="^--gpu-streams needs the CUDA backends"):
        main(["--gpu-streams", "--backends", "cuda-host", "--ranks", "2", "--sizes", "1024"])


@pytest.mark.parametrize("device, message", [("cuda", "device 'cuda': no CUDA device is visible"),
                                             ("gpu", "unknown device 'gpu': use auto, cpu, cuda or cuda:N")])
def test_bench_replay_device_it_cannot_use(no_gpu, capsys, device, message):
    """Was torch's AssertionError (not compiled with CUDA) or RuntimeError (device string) traceback."""
    assert cli(["bench", "replay", "--device", device, "--shapes", "1x20", "--reps", "1"]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_bench_draft_forward_device_it_cannot_use(no_gpu):
    with pytest.raises(LabError, match="^unknown device 'gpu'"):
        bdf.main(["--device", "gpu"])  # was torch.device's RuntimeError
    # "auto" and "cpu:0" (which the device check takes) pick the CPU's small defaults, not the 8B/Kimi shapes
    for name in ("auto", "cpu:0"):
        args = bdf.parse(["--device", name])
        assert (args.shapes, args.dtype, args.context) == (["tiny", "small"], "fp32", 128)


@pytest.mark.parametrize("fc", [True, False])
def test_step_bytes_are_the_weights_and_kv_a_step_moves(fc):
    """q/k/v/o over [embeds; hidden], gate/up/down, lm_head over the draft vocab, the norms, fc only on
    the first step (never the embedding table); K and V for context + 1 entries at the batch."""
    s = bdf.SHAPES["tiny"]
    H, inter, V, d = s["hidden_size"], s["intermediate_size"], s["draft_vocab_size"], s["head_dim"]
    q, kv = s["num_attention_heads"] * d, s["num_key_value_heads"] * d
    params = (2 * H * (q + 2 * kv) + q * H + 3 * H * inter + V * H + 4 * H
              + (3 * s["target_hidden_size"] * H if fc else 0))
    drafter = bdf.make_drafter("tiny", torch.bfloat16, "cpu", 0)
    assert bdf.step_bytes(drafter, 3, 10, fc=fc) == (2 * params, 2 * 3 * kv * 11 * 2)
