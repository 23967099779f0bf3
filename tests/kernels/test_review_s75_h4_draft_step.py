"""Review s75 h4 (mutation audit of draft_step's Python face): the dtypes `cuda_supports` hands the
kernels and the default path's fallback for the ones the op refuses, _load's reasons, the fake kernel's
later-step and device checks, and op_takes' head_dim."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.kernels import draft_step as ds

# What op_takes wants: head_dim 64, H a multiple of 8, the MLP width of 16; fc 3*32 -> 64.
CFG = DrafterConfig(hidden_size=64, intermediate_size=96, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                    draft_vocab_size=40, target_vocab_size=90, target_hidden_size=32, aux_layer_ids=[1, 2, 3])


def _step(dtype):
    torch.manual_seed(0)
    drafter = Eagle3Drafter(CFG).to(dtype)
    with torch.no_grad():
        drafter.d2t.copy_(torch.arange(CFG.draft_vocab_size))  # draft id i is target id 2i
    g = torch.Generator().manual_seed(1)
    embeds = torch.randn(2, CFG.hidden_size, generator=g).to(dtype)
    aux = torch.randn(2, 3 * CFG.target_hidden_size, generator=g).to(dtype)
    k, v = drafter.new_kv_cache(2, 8)
    k.normal_(generator=g)
    v.normal_(generator=g)
    lens = torch.tensor([3, 0])
    return drafter, embeds, aux, lens, k, v


def test_cuda_supports_leaves_fp64_to_the_reference(require_draft_step_op):
    """The op computes in fp32/bf16/fp16 and raises on fp64: a step it would refuse is not the kernels'."""
    require_draft_step_op("cpu")
    for dtype in ds.OP_DTYPES:
        drafter, embeds, aux, lens, k, v = _step(dtype)
        assert ds.cuda_supports(drafter, embeds, aux, k, v, 3), dtype
    drafter, embeds, aux, lens, k, v = _step(torch.float64)
    assert ds.op_takes(drafter.config)
    assert not ds.cuda_supports(drafter, embeds, aux, k, v, 3)
    with pytest.raises(RuntimeError, match="dtype must be float32, bfloat16 or float16"):
        ds.draft_step(drafter, embeds, aux, lens, k, v, lens, 3, use_fused=True)


def test_the_default_path_on_cuda_runs_an_fp64_step_on_the_reference(monkeypatch):
    """CUDA with the op built is faked (the tensors say they are on it; the CPU op stands in for the
    kernels): an fp64 drafter's step returns the reference's result, where it used to raise the op's error."""
    drafter, embeds, aux, lens, k, v = _step(torch.float64)
    with torch.no_grad():
        want = drafter.draft_step(embeds, aux, lens, k.clone(), v.clone(), lens, 3)
    monkeypatch.setattr(ds, "available", lambda device=None: True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    with torch.no_grad():
        got = ds.draft_step(drafter, embeds, aux, lens, k, v, lens, 3)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert (got[1] % 2 == 0).all()  # d2t mapped the ids


def test_load_says_why_the_op_is_missing(monkeypatch):
    """Without the op, _load names the extension's import error, or that the loaded _C lacks the op;
    it registers no fake kernel for an op that is not there."""
    monkeypatch.setattr(ds, "_has_kernel", lambda key: False)
    monkeypatch.setattr(torch.library, "register_fake", lambda name: pytest.fail("registered a fake kernel"))
    monkeypatch.setattr(ds._ext, "unavailable_reason", lambda: "drafter_lab._C is not built (test)")
    assert ds._load.__wrapped__() == "drafter_lab._C is not built (test)"
    monkeypatch.setattr(ds._ext, "unavailable_reason", lambda: "")
    assert ds._load.__wrapped__() == "drafter_lab._C has no draft_step op"


def test_the_fake_kernel_takes_a_later_step_and_refuses_a_3d_embeds(require_draft_step_op):
    """A later step passes no fc_weight (None among the tensors): the fake kernel traces it; embeds that
    are not [B, H] are refused there as the op refuses them."""
    require_draft_step_op("cpu")
    drafter, embeds, _, lens, k, v = _step(torch.float32)
    hidden = torch.randn(2, CFG.hidden_size)
    args = ds.op_args(drafter, embeds, hidden, lens, k, v, lens, 5)
    assert args[6] is None
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    out, ids, logp = torch.ops.drafter_lab.draft_step(*meta)
    assert (out.shape, ids.shape, logp.shape) == ((2, CFG.hidden_size), (2, 5), (2, 5))
    meta[0] = meta[0][None]
    with pytest.raises(RuntimeError, match=r"embeds must be \[B, H\]"):
        torch.ops.drafter_lab.draft_step(*meta)


def test_the_fake_kernel_refuses_one_meta_tensor_among_real_ones(require_draft_step_op):
    """Meta outranks CPU in dispatch: a meta cache among CPU tensors lands on the fake kernel, which
    refuses it as the op would, instead of handing back uninitialised outputs."""
    require_draft_step_op("cpu")
    drafter, embeds, aux, lens, k, v = _step(torch.float32)
    args = list(ds.op_args(drafter, embeds, aux, lens, k, v, lens, 3))
    args[3] = args[3].to("meta")
    with pytest.raises(RuntimeError, match="all tensors must be on cpu; found one on meta"):
        torch.ops.drafter_lab.draft_step(*args)


def test_op_takes_head_dim_64_and_128_only():
    for head_dim, taken in ((64, True), (128, True), (32, False), (96, False), (256, False)):
        assert ds.op_takes(dataclasses.replace(CFG, head_dim=head_dim)) is taken, head_dim
