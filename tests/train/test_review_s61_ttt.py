"""The TTT objective against an independent reference of what SGLang/vLLM serve and SpecForge trains.

The reference is written from those engines' semantics, not from drafter_lab's code: per-head loops,
HF's repeat_kv head grouping, RoPE from the formula. Serving (SGLang, vLLM): the draft extend runs the
pair (target state h_j, token x_{j+1}) at RoPE position j for every prefix position; a chain rooted at
t then runs step k on (its own previous pre-norm state, x_{t+k+1}) at position t + k, attending to the
extend's keys 0..t and to its own keys of steps 1..k. The loss is SpecForge's: target logits restricted
to the draft vocab (t2d), softmax; a position is dropped when the target's full-vocab argmax is not
drafted; step k weighs 0.8**k. Loss mask and normalisation follow ttt.py's documented conventions
(the predicted token is an assistant token; each step's mean over its loss positions).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.train.data import Example, collate, target_top1
from drafter_lab.train.ttt import CE_SUM, N_CORRECT, N_LOSS, N_VALID, TTTObjective

V, N, H, HT, K = 41, 13, 32, 24, 4
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 6  # GQA, and head_dim != H / heads


def make(norm_before_residual: bool, seed: int = 0):
    cfg = DrafterConfig(hidden_size=H, intermediate_size=48, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                        head_dim=HEAD_DIM, draft_vocab_size=N, target_vocab_size=V, target_hidden_size=HT,
                        aux_layer_ids=[2, 4, 5], rope_theta=50.0, rms_norm_eps=1e-2,
                        norm_before_residual=norm_before_residual)
    torch.manual_seed(seed)
    d = Eagle3Drafter(cfg).double()
    with torch.no_grad():
        for p in d.parameters():  # norm weights random too, so that a swapped norm shows
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.ndim == 1 else 0.0))
    used = torch.sort(torch.randperm(V)[:N]).values
    d.d2t.copy_(used - torch.arange(N))
    d.t2d[used] = True
    head = torch.randn(V, HT, dtype=torch.float64)
    head[used] *= 1.5  # the target's top-1 mostly drafted, not always
    examples = []
    for T in (12, 8, 10):
        final = torch.randn(T, HT, dtype=torch.float64)
        top1, _ = target_top1(final, head)
        examples.append(Example(torch.randint(0, V, (T,)), torch.rand(T) < 0.7,
                                torch.randn(T, 3 * HT, dtype=torch.float64), final, top1))
    return d, head, used, examples


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta):
    """HF/SGLang neox layout: x [heads, d] at one position."""
    half = x.shape[-1] // 2
    freqs = pos / theta ** (torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    cos, sin = torch.cat([freqs, freqs]).cos(), torch.cat([freqs, freqs]).sin()
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class Served:
    """One drafter step at a time, the way the engines run it."""

    def __init__(self, d: Eagle3Drafter, rope_step: int = 1, hide: int = 0):
        self.d, self.c, self.m = d, d.config, d.midlayer
        self.rope_step = rope_step  # step k's RoPE position is t + rope_step * k
        self.hide = hide  # step k >= 1 does not see the extend's keys t-hide*k+1..t (hide=1: EAGLE-3's first TTT)

    def qkv(self, token, h, pos):
        """(q, k, v, residual) of the pair (embed(token), h) at RoPE position pos."""
        m, a, eps = self.m, self.m.self_attn, self.c.rms_norm_eps
        e = self.d.embed_tokens.weight[token]
        normed = rms(h, m.hidden_norm.weight, eps)
        x = torch.cat([rms(e, m.input_layernorm.weight, eps), normed])  # [embeds, hidden]
        q = (a.q_proj.weight @ x).view(HEADS, HEAD_DIM)
        k = (a.k_proj.weight @ x).view(KV_HEADS, HEAD_DIM)
        v = (a.v_proj.weight @ x).view(KV_HEADS, HEAD_DIM)
        residual = normed if self.c.norm_before_residual else h  # vLLM's switch; SGLang: h
        return rope(q, pos, self.c.rope_theta), rope(k, pos, self.c.rope_theta), v, residual

    def finish(self, residual, q, keys, values):
        m, eps = self.m, self.c.rms_norm_eps
        out = []
        for head in range(HEADS):
            g = head // (HEADS // KV_HEADS)  # repeat_kv: query head h reads kv head h // group
            ks = torch.stack([k[g] for k in keys])
            vs = torch.stack([v[g] for v in values])
            p = torch.softmax(ks @ q[head] / math.sqrt(HEAD_DIM), 0)
            out.append(p @ vs)
        h1 = residual + m.self_attn.o_proj.weight @ torch.cat(out)
        n = rms(h1, m.post_attention_layernorm.weight, eps)
        return h1 + m.mlp.down_proj.weight @ (F.silu(m.mlp.gate_proj.weight @ n) * (m.mlp.up_proj.weight @ n))

    def logits(self, h):
        return self.d.lm_head.weight @ rms(h, self.d.norm.weight, self.c.rms_norm_eps)  # pre-norm h passed on

    @torch.no_grad()
    def chains(self, e: Example, steps: int) -> dict:
        """{(t, k): draft logits of step k of the chain rooted at t}, tokens teacher-forced."""
        T = len(e)
        keys, values, h0 = [], [], []
        for j in range(T - 1):  # draft extend: fc on the target's aux states, token x_{j+1}, position j
            h = self.d.fc.weight @ e.aux_hidden[j]
            q, k, v, res = self.qkv(e.input_ids[j + 1], h, j)
            keys.append(k)
            values.append(v)
            h0.append(self.finish(res, q, keys, values))
        out = {}
        for t in range(T - 1):
            own_k, own_v, h = [], [], h0[t]
            out[t, 0] = self.logits(h)
            for k in range(1, steps):
                if t + k + 1 > T - 1:
                    break
                q, kk, vv, res = self.qkv(e.input_ids[t + k + 1], h, t + self.rope_step * k)
                own_k, own_v = own_k + [kk], own_v + [vv]
                seen = max(t + 1 - self.hide * k, 0)  # the extend's keys this step attends to
                h = self.finish(res, q, keys[:seen] + own_k, values[:seen] + own_v)
                out[t, k] = self.logits(h)
        return out


def reference(d, head, used, examples, decay=0.8, served=None):
    """(loss, per-step [valid, in loss, CE sum, correct]) from the served chains."""
    cols = torch.zeros(K, 4, dtype=torch.float64)
    served = served or Served(d)
    for e in examples:
        T = len(e)
        target = e.final_hidden @ head.T
        for (t, k), logits in served.chains(e, K).items():
            s = 1 + k
            if t + s + 1 > T - 1 or not e.loss_mask[t + s + 1]:  # predicts x_{t+s+1}: an assistant token?
                continue
            full = target[t + s]  # the target's distribution of x_{t+s+1}
            cols[k, 0] += 1
            cols[k, 3] += float(used[logits.argmax()] == full.argmax())
            if d.t2d[full.argmax()]:
                teacher = torch.softmax(full[d.t2d], -1)
                cols[k, 1] += 1
                cols[k, 2] += float(-(teacher * torch.log_softmax(logits, -1)).sum())
    loss = sum(decay ** k * cols[k, 2] / cols[k, 1] for k in range(K))
    return float(loss), cols


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_ttt_objective_equals_the_served_chains(norm_before_residual):
    d, head, used, examples = make(norm_before_residual)
    loss, counts = TTTObjective(d, head[used], K, 0.8)(collate(examples))
    want_loss, want = reference(d, head, used, examples)
    assert torch.equal(counts[:, [N_VALID, N_LOSS, N_CORRECT]], want[:, [0, 1, 3]])
    torch.testing.assert_close(counts[:, CE_SUM], want[:, 2], rtol=1e-9, atol=1e-9)
    assert math.isclose(loss.item(), want_loss, rel_tol=1e-9)
    assert 0 < want[:, 1].sum() < want[:, 0].sum()  # some positions dropped for an undrafted top-1
    assert want[:, 3].sum() > 0  # the argmax comparison is exercised


@pytest.mark.parametrize("variant", [dict(rope_step=0), dict(hide=1)])
def test_the_reference_tells_other_ttt_conventions_apart(variant):
    """The check above is sharp: conventions some SpecForge/EAGLE versions trained with (RoPE at t at every
    step; each step hiding one more of the extend's keys) give another loss than the served chains."""
    d, head, used, examples = make(False)
    loss, _ = TTTObjective(d, head[used], K, 0.8)(collate(examples))
    other, _ = reference(d, head, used, examples, served=Served(d, **variant))
    assert abs(loss.item() - other) > 1e-4
