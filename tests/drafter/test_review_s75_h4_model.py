"""Review s75 h4 (mutation audit of the reference drafter): norms computed in fp32 for half inputs,
TTT step 2 against decoding with two draft entries past the prefix, the frozen embedding, and the
KV cache new_kv_cache makes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter, RMSNorm

CFG = DrafterConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                    draft_vocab_size=20, target_vocab_size=50, target_hidden_size=24, aux_layer_ids=[1, 2, 3],
                    rope_theta=300.0, rms_norm_eps=1e-5)


def _drafter(seed: int, dtype=torch.float64) -> Eagle3Drafter:
    """Random weights everywhere (norm weights too), so that no piece is an identity."""
    torch.manual_seed(seed)
    d = Eagle3Drafter(CFG).to(dtype)
    with torch.no_grad():
        for p in d.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.ndim == 1 else 1.0 / math.sqrt(p.shape[-1])) + (p.ndim == 1))
    return d


def test_rms_norm_of_fp16_squares_in_fp32():
    """x**2 of an fp16 activation past 256 overflows fp16 (max 65504): the norm squares in fp32, as HF's
    LlamaRMSNorm does, and only the result is fp16."""
    norm = RMSNorm(16, 1e-6).half()
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 16))
    x = (torch.randn(3, 16, generator=torch.Generator().manual_seed(0)) * 1000).half()
    with torch.no_grad():
        got = norm(x)
    x64, w64 = x.double().numpy(), norm.weight.detach().double().numpy()
    want = w64 * (x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6))
    assert got.dtype == torch.float16 and torch.isfinite(got).all()
    np.testing.assert_allclose(got.double().numpy(), want, rtol=2e-3, atol=2e-3)


def test_only_the_embedding_is_frozen():
    """The target's embedding is copied in and never trained; every other weight is."""
    d = Eagle3Drafter(CFG)
    frozen = [n for n, p in d.named_parameters() if not p.requires_grad]
    assert frozen == ["embed_tokens.weight"]


def test_new_kv_cache_takes_the_dtype_and_device_asked_for():
    d = Eagle3Drafter(CFG).to(torch.float64)
    k, v = d.new_kv_cache(3, 5)
    shape = (3, CFG.num_key_value_heads, 5, CFG.head_dim)
    assert k.shape == v.shape == shape and k.dtype == v.dtype == torch.float64
    assert not k.any() and not v.any() and k.data_ptr() != v.data_ptr()
    k, v = d.new_kv_cache(3, 5, dtype=torch.bfloat16, device="meta")
    assert (k.dtype, v.dtype, k.device.type, v.device.type) == (torch.bfloat16, torch.bfloat16, "meta", "meta")
    k, _ = d.to("meta").new_kv_cache(3, 5)  # by default on the drafter's device
    assert k.device.type == "meta" and k.dtype == torch.float64


def test_draft_step_refuses_a_hidden_state_of_another_width():
    """Neither H nor 3*H_t: a one-line error naming the width, not a shape error deep in the layer."""
    d = Eagle3Drafter(CFG)
    k, v = d.new_kv_cache(2, 4)
    lens = torch.tensor([0, 1])
    embeds = torch.randn(2, CFG.hidden_size)
    with pytest.raises(ValueError, match=r"^hidden has width 40, want 32 or 3\*H_t$"):
        d.draft_step(embeds, torch.randn(2, 40), lens, k, v, lens, topk=2)
    h, _, _ = d.draft_step(embeds, torch.randn(2, 3 * CFG.target_hidden_size), lens, k, v, lens, topk=2)
    assert h.shape == (2, CFG.hidden_size)
