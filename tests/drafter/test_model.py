"""The reference drafter against an independent, loop-by-loop implementation of DESIGN's formula."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter, rope_inv_freq


def small_config(**over) -> DrafterConfig:
    base = dict(
        hidden_size=48,
        intermediate_size=80,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,  # != hidden / heads: q/k/v widths are heads * head_dim
        draft_vocab_size=37,
        target_vocab_size=101,
        target_hidden_size=40,  # != hidden: fc is 3*40 -> 48
        aux_layer_ids=[2, 4, 5],
        rope_theta=500.0,
        rms_norm_eps=1e-5,
    )
    base.update(over)
    return DrafterConfig(**base)


def random_drafter(cfg: DrafterConfig, seed: int, dtype=torch.float64) -> Eagle3Drafter:
    """Every weight random (norm weights too, so a swapped norm would show)."""
    torch.manual_seed(seed)
    d = Eagle3Drafter(cfg).to(dtype)
    with torch.no_grad():
        for p in d.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.ndim == 1 else 1.0 / math.sqrt(p.shape[-1])) + (1.0 if p.ndim == 1 else 0.0))
        used = torch.sort(torch.randperm(cfg.target_vocab_size)[: cfg.draft_vocab_size]).values
        d.d2t.copy_(used - torch.arange(cfg.draft_vocab_size))
        d.t2d.zero_()
        d.t2d[used] = True
    return d


def weights(d: Eagle3Drafter) -> dict[str, np.ndarray]:
    return {k: v.detach().double().numpy() for k, v in d.state_dict().items()}


def rms(x, w, eps):
    return w * x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
"""Llama-3.1's scaling with a short original context, so that head_dim 16 at theta 500 has kept, blended
and scaled frequencies."""


def freqs(cfg: DrafterConfig) -> list[float]:
    """theta^(-2i/d), scaled piece by piece as Meta's Llama 3.1 reference describes it."""
    out = []
    for i in range(cfg.head_dim // 2):
        f = cfg.rope_theta ** (-2.0 * i / cfg.head_dim)
        sc = cfg.rope_scaling
        if sc is not None and sc["rope_type"] == "linear":
            f /= sc["factor"]
        elif sc is not None:
            wavelen, old = 2 * math.pi / f, sc["original_max_position_embeddings"]
            if wavelen > old / sc["low_freq_factor"]:
                f /= sc["factor"]
            elif wavelen >= old / sc["high_freq_factor"]:
                smooth = (old / wavelen - sc["low_freq_factor"]) / (sc["high_freq_factor"] - sc["low_freq_factor"])
                f = (1 - smooth) * f / sc["factor"] + smooth * f
        out.append(f)
    return out


@pytest.mark.parametrize("scaling", [LLAMA3, {"rope_type": "linear", "factor": 4.0}])
def test_rope_frequencies_are_transformers_own(scaling):
    """The scaled frequencies equal those transformers gives a Llama config with the same rope_scaling."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = small_config(rope_scaling=scaling)
    hf = LlamaConfig(hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_attention_heads, head_dim=cfg.head_dim,
                     rope_theta=cfg.rope_theta, rope_scaling=dict(scaling))
    want = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf, "cpu")[0]
    torch.testing.assert_close(rope_inv_freq(cfg.head_dim, cfg.rope_theta, scaling), want, rtol=1e-6, atol=0)
    np.testing.assert_allclose(freqs(cfg), want.double().numpy(), rtol=1e-6)
    assert not torch.allclose(want, rope_inv_freq(cfg.head_dim, cfg.rope_theta))  # scaling moves them


def rope(vec, pos, inv):
    """Rotate pairs (i, i + d/2) by pos * inv[i]."""
    d = len(vec)
    out = np.empty_like(vec)
    for i in range(d // 2):
        ang = pos * inv[i]
        c, s = math.cos(ang), math.sin(ang)
        out[i] = vec[i] * c - vec[i + d // 2] * s
        out[i + d // 2] = vec[i + d // 2] * c + vec[i] * s
    return out


def plain_layer(W, cfg: DrafterConfig, emb, h, positions):
    """DESIGN section 3, one step over a sequence with causal attention, position by position."""
    eps, d, nh, nkv = cfg.rms_norm_eps, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    x = np.concatenate([rms(emb, W["midlayer.input_layernorm.weight"], eps),
                        rms(h, W["midlayer.hidden_norm.weight"], eps)], -1)
    T, inv = len(x), freqs(cfg)
    q = x @ W["midlayer.self_attn.q_proj.weight"].T
    k = x @ W["midlayer.self_attn.k_proj.weight"].T
    v = x @ W["midlayer.self_attn.v_proj.weight"].T
    attn = np.zeros((T, nh * d))
    for head in range(nh):
        kv = head // (nh // nkv)
        for t in range(T):
            qt = rope(q[t, head * d:(head + 1) * d], positions[t], inv)
            scores = []
            for s in range(t + 1):
                ks = rope(k[s, kv * d:(kv + 1) * d], positions[s], inv)
                scores.append(qt @ ks / math.sqrt(d))
            p = np.exp(np.array(scores) - max(scores))
            p /= p.sum()
            attn[t, head * d:(head + 1) * d] = sum(p[s] * v[s, kv * d:(kv + 1) * d] for s in range(t + 1))
    residual = rms(h, W["midlayer.hidden_norm.weight"], eps) if cfg.norm_before_residual else h
    h1 = residual + attn @ W["midlayer.self_attn.o_proj.weight"].T
    n = rms(h1, W["midlayer.post_attention_layernorm.weight"], eps)
    g = n @ W["midlayer.mlp.gate_proj.weight"].T
    u = n @ W["midlayer.mlp.up_proj.weight"].T
    h2 = h1 + (g / (1 + np.exp(-g)) * u) @ W["midlayer.mlp.down_proj.weight"].T
    logits = rms(h2, W["norm.weight"], eps) @ W["lm_head.weight"].T
    return h2, logits


@pytest.mark.parametrize("norm_before_residual, rope_scaling", [(False, None), (True, None), (False, LLAMA3)])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_step0_matches_plain_formula(dtype, tol, norm_before_residual, rope_scaling):
    cfg = small_config(norm_before_residual=norm_before_residual, rope_scaling=rope_scaling)
    d = random_drafter(cfg, seed=1, dtype=dtype)
    W = weights(d)
    T = 7
    g = torch.Generator().manual_seed(2)
    aux = torch.randn(T, 3 * cfg.target_hidden_size, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, cfg.target_vocab_size, (T,), generator=g)
    positions = np.arange(T) + 3  # any offset: RoPE must use the given positions

    emb = W["embed_tokens.weight"][tokens.numpy()]
    h0 = aux.numpy() @ W["fc.weight"].T
    want_h, want_logits = plain_layer(W, cfg, emb, h0, positions)

    with torch.no_grad():
        hidden = d.project(aux.to(dtype))
        got_h = d.ttt_step(d.embed(tokens)[None], hidden[None], torch.tensor(positions)[None], [])[0]
        got_logits = d.logits(got_h)
    np.testing.assert_allclose(got_h.double().numpy(), want_h, rtol=tol, atol=tol)
    np.testing.assert_allclose(got_logits.double().numpy(), want_logits, rtol=tol, atol=tol * 10)

    # The decode path, first token against an empty cache, is the same formula at t = 0.
    kc, vc = d.new_kv_cache(1, 4, dtype=dtype)
    with torch.no_grad():
        h, top, logp = d.draft_step(d.embed(tokens[:1]), aux[:1].to(dtype), torch.tensor(positions[:1]), kc, vc,
                                    torch.zeros(1, dtype=torch.long), topk=3)
    want0, logits0 = plain_layer(W, cfg, emb[:1], h0[:1], positions[:1])
    np.testing.assert_allclose(h.double().numpy(), want0, rtol=tol, atol=tol)
    order = np.argsort(-logits0[0])[:3]
    assert top[0].tolist() == [int(i + W["d2t"][i]) for i in order]
    want_logp = logits0[0] - np.log(np.exp(logits0[0] - logits0[0].max()).sum()) - logits0[0].max()
    np.testing.assert_allclose(logp[0].double().numpy(), want_logp[order], rtol=tol * 10, atol=tol * 10)


def test_draft_step_after_prefill_equals_ttt_steps_0_1_and_2():
    """Decoding one token at a time reproduces TTT steps 0, 1 and 2 at every position. Step 2 reads its
    position's step-1 and step-2 keys, each weighed with its own value: a later step's probability on an
    earlier value shows there, not at step 1."""
    cfg = small_config(target_hidden_size=48)  # H == H_t as well
    d = random_drafter(cfg, seed=3)
    T = 9
    g = torch.Generator().manual_seed(4)
    aux = torch.randn(1, T, 3 * cfg.target_hidden_size, generator=g, dtype=torch.float64)
    ids = torch.randint(0, cfg.target_vocab_size, (1, T + 3), generator=g)
    pos = torch.arange(T)[None]
    with torch.no_grad():
        cache: list = []
        h0 = d.ttt_step(d.embed(ids[:, 1:T + 1]), d.project(aux), pos, cache)  # step 0: token x_{t+1}
        h1 = d.ttt_step(d.embed(ids[:, 2:T + 2]), h0, pos + 1, cache)  # step 1: token x_{t+2}, position t+1
        h2 = d.ttt_step(d.embed(ids[:, 3:T + 3]), h1, pos + 2, cache)
        assert not torch.allclose(h2, h1)

        kc, vc = d.new_kv_cache(1, T + 2)
        prefill = []
        for t in range(T):
            h, _, _ = d.draft_step(d.embed(ids[:, t + 1]), aux[:, t], torch.tensor([t]), kc, vc,
                                   torch.tensor([t]), topk=1)
            prefill.append(h)
        torch.testing.assert_close(torch.stack(prefill, 1), h0, rtol=1e-10, atol=1e-10)

        for t in range(T):
            k2, v2 = kc.clone(), vc.clone()  # cache holds step-0 entries 0..t; step 1 writes at t+1, step 2 at t+2
            k2[:, :, t + 1:] = 0
            v2[:, :, t + 1:] = 0
            h, _, _ = d.draft_step(d.embed(ids[:, t + 2]), h0[:, t], torch.tensor([t + 1]), k2, v2,
                                   torch.tensor([t + 1]), topk=1)
            torch.testing.assert_close(h, h1[:, t], rtol=1e-10, atol=1e-10)
            h, _, _ = d.draft_step(d.embed(ids[:, t + 3]), h, torch.tensor([t + 2]), k2, v2,
                                   torch.tensor([t + 2]), topk=1)
            torch.testing.assert_close(h, h2[:, t], rtol=1e-10, atol=1e-10)


def test_to_target_ids_uses_d2t_offsets():
    cfg = small_config()
    d = random_drafter(cfg, seed=5)
    used = torch.nonzero(d.t2d).flatten()
    assert torch.equal(d.to_target_ids(torch.arange(cfg.draft_vocab_size)), used)


def test_draft_step_ignores_non_finite_garbage_past_the_cache_length():
    """Entries past cache_lens get probability 0, yet 0 * inf is NaN: stale inf/NaN there change nothing,
    as in the fused op."""
    cfg = small_config()
    d = random_drafter(cfg, seed=6)
    g = torch.Generator().manual_seed(7)
    lens = torch.tensor([2, 0, 5])
    e, h = torch.randn(3, 48, generator=g, dtype=torch.float64), torch.randn(3, 120, generator=g, dtype=torch.float64)
    clean = d.new_kv_cache(3, 8)
    dirty = [t.clone() for t in clean]
    for b, n in enumerate(lens.tolist()):
        dirty[0][b, :, n + 1:] = float("nan")
        dirty[1][b, :, n + 1:] = float("inf")
    with torch.no_grad():
        want = d.draft_step(e, h, lens, *clean, lens, topk=3)
        got = d.draft_step(e, h, lens, *dirty, lens, topk=3)
    for a, b in zip(want, got):
        assert torch.equal(a, b)
