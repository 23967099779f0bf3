"""Review of draft_step's fake (meta) kernel: the Meta dispatch key outranks CPU and CUDA, so one
argument on meta among real ones runs the fake kernel, which returned uninitialised tensors on
embeds' device where the real kernels refuse a mixed-device call."""

from __future__ import annotations

import pytest
import torch
from test_draft_step import Shape, make_drafter, make_inputs  # this directory is on sys.path

from drafter_lab.kernels import draft_step as ds

SHAPE = Shape(batch=2, hidden=128, heads=2, kv_heads=1, head_dim=64, inter=256, vocab=1000,
              target_hidden=64, context=4, topk=2, fc=True)


def _args() -> list:
    drafter = make_drafter(SHAPE, 3, "cpu")
    inp = make_inputs(SHAPE, 3, "cpu", torch.float32)
    return list(ds.op_args(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache, inp.v_cache,
                           inp.cache_lens, SHAPE.topk))


def test_one_argument_on_meta_is_refused(require_draft_step_op):
    require_draft_step_op("cpu")
    args = _args()
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    assert args[6] is not None and 6 in tensors  # fc_weight, the optional one, is checked too
    for i in tensors:
        bad = list(args)
        bad[i] = bad[i].to("meta")
        with pytest.raises(RuntimeError, match="draft_step: all tensors must be on"):
            torch.ops.drafter_lab.draft_step(*bad)


def test_all_arguments_on_meta_still_trace(require_draft_step_op):
    require_draft_step_op("cpu")
    args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in _args()]
    hidden, ids, logp = torch.ops.drafter_lab.draft_step(*args)
    assert hidden.device.type == ids.device.type == logp.device.type == "meta"
    assert hidden.shape == (SHAPE.batch, SHAPE.hidden) and ids.shape == logp.shape == (SHAPE.batch, SHAPE.topk)
