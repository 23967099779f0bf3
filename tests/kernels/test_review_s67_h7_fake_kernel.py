"""The fake kernel's topk bounds (moved from tests/spec: it builds its inputs with test_draft_step's helpers,
which this directory's tests import)."""

from __future__ import annotations

import pytest
import torch
from test_draft_step import Shape, make_drafter, make_inputs  # this directory is on sys.path

from drafter_lab.kernels import draft_step as fused_op


def test_the_fake_kernel_takes_topk_1_to_the_draft_vocab(require_draft_step_op):
    """The fake kernel's topk bounds are the op's, [1, N] with N the lm_head's rows (not its width)."""
    require_draft_step_op("cpu")
    shape = Shape(batch=2, hidden=128, heads=2, kv_heads=2, head_dim=64, inter=192, vocab=300, target_hidden=64,
                  context=6, topk=3, fc=True)
    drafter, inp = make_drafter(shape, 4, "cpu"), make_inputs(shape, 4, "cpu", torch.float32)
    args = fused_op.op_args(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache, inp.v_cache,
                            inp.cache_lens, 3)
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    for topk in (1, 300):
        _, ids, logp = torch.ops.drafter_lab.draft_step(*meta[:-1], topk)
        assert ids.shape == logp.shape == (2, topk)
    with pytest.raises(RuntimeError, match=r"topk outside \[1, N\]"):
        torch.ops.drafter_lab.draft_step(*meta[:-1], 301)
    for topk in (1, fused_op.CUDA_MAX_TOPK):  # the CUDA kernels' bounds, both taken
        assert fused_op.cuda_supports(drafter, inp.embeds, inp.hidden, inp.k_cache, inp.v_cache, topk)
