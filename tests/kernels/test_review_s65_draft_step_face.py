"""Review s65 (mutation audit) of draft_step's Python face: the fake kernel's output dtypes and topk check,
which steps `op_takes` / `cuda_supports` hand the CUDA kernels, how `op_args` decides fc when 3*H_t equals
H, the RoPE table cache's key, and the refusal of a forced op that has no kernel for the device."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_draft_step import Shape, make_drafter, make_inputs  # this directory is on sys.path

from drafter_lab.errors import LabError
from drafter_lab.kernels import draft_step as ds

SHAPE = Shape(batch=2, hidden=128, heads=2, kv_heads=2, head_dim=64, inter=192, vocab=1000,
              target_hidden=64, context=6, topk=3, fc=True)


def _step(shape=SHAPE, dtype=torch.float32, seed=4):
    return make_drafter(shape, seed, "cpu").to(dtype), make_inputs(shape, seed, "cpu", dtype)


def test_the_fake_kernel_gives_the_ops_dtypes_and_refuses_topk_zero(require_draft_step_op):
    """torch.compile traces with the fake kernel: its outputs must be what the op returns, whatever the
    model's dtype (int64 ids, float32 log-probs), and a topk the op refuses is refused there too."""
    require_draft_step_op("cpu")
    drafter, inp = _step(dtype=torch.bfloat16)
    args = ds.op_args(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache, inp.v_cache, inp.cache_lens, 3)
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    hidden, ids, logp = torch.ops.drafter_lab.draft_step(*meta)
    assert (hidden.dtype, ids.dtype, logp.dtype) == (torch.bfloat16, torch.int64, torch.float32)
    real = torch.ops.drafter_lab.draft_step(*args)  # the CPU op agrees
    assert tuple(t.dtype for t in real) == (hidden.dtype, ids.dtype, logp.dtype)
    meta[-1] = 0
    with pytest.raises(RuntimeError, match=r"topk outside \[1, N\]"):
        torch.ops.drafter_lab.draft_step(*meta)


def test_op_takes_only_a_hidden_size_in_eights():
    cfg = make_drafter(SHAPE, 4, "cpu").config
    assert ds.op_takes(cfg)
    assert not ds.op_takes(dataclasses.replace(cfg, hidden_size=132))  # a multiple of 4, not of 8
    assert not ds.op_takes(dataclasses.replace(cfg, intermediate_size=200))  # of 8, not of 16


def _offset(t: torch.Tensor, elements: int) -> torch.Tensor:
    """A contiguous copy of `t` `elements` past a 16-byte boundary of a larger buffer."""
    buf = torch.empty(t.numel() + elements, dtype=t.dtype)
    out = buf[elements:].view(t.shape)
    out.copy_(t)
    return out


def test_cuda_supports_edges():
    """topk 0, a cache 8 bytes off 16, and a later step's hidden state in another dtype go to the
    reference; the first step's aux states in another dtype do not (op_args casts them for fc)."""
    drafter, inp = _step()
    k, v = inp.k_cache, inp.v_cache
    assert ds.cuda_supports(drafter, inp.embeds, inp.hidden, k, v, 1)
    assert not ds.cuda_supports(drafter, inp.embeds, inp.hidden, k, v, 0)
    eight = _offset(v, 2)
    assert eight.data_ptr() % 16 == 8
    assert not ds.cuda_supports(drafter, inp.embeds, inp.hidden, k, eight, 3)
    assert ds.cuda_supports(drafter, inp.embeds, inp.hidden.half(), k, v, 3)  # aux states [B, 3*H_t]
    plain = torch.randn(SHAPE.batch, SHAPE.hidden)
    assert ds.cuda_supports(drafter, inp.embeds, plain, k, v, 3)
    assert not ds.cuda_supports(drafter, inp.embeds, plain.half(), k, v, 3)


def test_op_args_cast_the_aux_states_to_fc(require_draft_step_op):
    """The reference's fc casts the aux states to its dtype; the forced op takes them the same way."""
    require_draft_step_op("cpu")
    drafter, inp = _step(dtype=torch.bfloat16)
    args = ds.op_args(drafter, inp.embeds, inp.hidden.float(), inp.positions, inp.k_cache, inp.v_cache,
                      inp.cache_lens, 3)
    assert args[1].dtype == torch.bfloat16 and args[6] is not None
    with torch.no_grad():
        want = ds.draft_step(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache.clone(), inp.v_cache.clone(),
                             inp.cache_lens, 3, use_fused=True)
        got = ds.draft_step(drafter, inp.embeds, inp.hidden.float(), inp.positions, inp.k_cache.clone(),
                            inp.v_cache.clone(), inp.cache_lens, 3, use_fused=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_hidden_state_of_the_drafters_width_skips_fc_even_where_3_h_t_equals_h():
    """As the reference decides: with H = 3*H_t, a [B, H] input is a later step's hidden state."""
    shape = dataclasses.replace(SHAPE, hidden=192, target_hidden=64)
    drafter, inp = _step(shape)
    assert inp.hidden.shape[-1] == 192 == 3 * drafter.config.target_hidden_size
    args = ds.op_args(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache, inp.v_cache, inp.cache_lens, 3)
    assert args[6] is None


def test_rope_table_follows_the_scaling_and_the_device():
    drafter, _ = _step()
    plain = ds.rope_frequencies(drafter, "cpu")
    assert ds.rope_frequencies(drafter, "cpu") is plain  # made once: a CUDA graph replays the same memory
    assert ds.rope_frequencies(drafter, "meta").device.type == "meta"
    drafter.config.rope_scaling = {"rope_type": "linear", "factor": 4.0}
    assert torch.allclose(ds.rope_frequencies(drafter, "cpu"), plain / 4)


def test_a_forced_op_without_a_kernel_for_the_device_is_one_line(monkeypatch):
    """Built (registered) but without this device's kernel: a LabError naming the device, not the
    dispatcher's traceback."""
    drafter, inp = _step()
    monkeypatch.setattr(ds, "_load", lambda: None)
    monkeypatch.setattr(ds, "available", lambda device=None: device is None)
    with pytest.raises(LabError, match="^the fused draft_step op was built without a cpu kernel$"):
        ds.draft_step(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache, inp.v_cache, inp.cache_lens, 3,
                      use_fused=True)


def test_available_asks_for_the_devices_own_kernel(monkeypatch):
    """A CPU-only build has no CUDA kernel: `available("cuda")` must say so, or the default path would
    hand CUDA tensors to an op that cannot take them."""
    monkeypatch.setattr(ds, "_load", lambda: None)
    monkeypatch.setattr(ds, "_has_kernel", lambda key: key == "CPU")
    assert ds.available() and ds.available("cpu") and not ds.available("cuda") and not ds.available("cuda:1")
    monkeypatch.setattr(ds, "_has_kernel", lambda key: key == "CUDA")
    assert ds.available("cuda:0") and not ds.available(torch.device("cpu"))


def test_the_op_normalises_with_the_drafters_eps(require_draft_step_op):
    """A trained drafter's rms_norm_eps reaches the op: with a large one the step differs from eps=1e-6."""
    require_draft_step_op("cpu")
    from drafter_lab.drafter.model import RMSNorm

    drafter, inp = _step()
    drafter.config.rms_norm_eps = 0.5
    for m in drafter.modules():
        if isinstance(m, RMSNorm):
            m.eps = 0.5
    with torch.no_grad():
        ref = drafter.draft_step(inp.embeds, inp.hidden, inp.positions, inp.k_cache.clone(), inp.v_cache.clone(),
                                 inp.cache_lens, 3)
        op = ds.draft_step(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache.clone(), inp.v_cache.clone(),
                           inp.cache_lens, 3, use_fused=True)
    assert torch.allclose(op[0], ref[0], rtol=1e-4, atol=1e-4) and torch.allclose(op[2], ref[2], atol=1e-3)


class _OpCalled(Exception):
    pass


def test_the_default_path_hands_the_kernels_only_what_cuda_supports(monkeypatch):
    """On CUDA with the op built, a step the kernels do not take (topk past CUDA_MAX_TOPK) runs the
    reference instead of the op's error; a step they take runs the op. CUDA is faked: the tensors say
    they are on it, and the op's arguments are never made."""
    drafter, inp = _step()
    monkeypatch.setattr(ds, "available", lambda device=None: True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))

    def op_args(*a, **k):
        raise _OpCalled

    monkeypatch.setattr(ds, "op_args", op_args)
    topk = ds.CUDA_MAX_TOPK + 1
    with torch.no_grad():
        ref = drafter.draft_step(inp.embeds, inp.hidden, inp.positions, inp.k_cache.clone(), inp.v_cache.clone(),
                                 inp.cache_lens, topk)
        got = ds.draft_step(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache.clone(), inp.v_cache.clone(),
                            inp.cache_lens, topk)
        assert all(torch.equal(a, b) for a, b in zip(got, ref))
        with pytest.raises(_OpCalled):
            ds.draft_step(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache.clone(), inp.v_cache.clone(),
                          inp.cache_lens, 3)
