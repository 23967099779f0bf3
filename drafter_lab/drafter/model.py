"""EAGLE-3 drafter, the plain PyTorch reference (DESIGN section 3).

    h0      = fc(cat(aux_0, aux_1, aux_2))                 first step only; later steps feed h
    x       = cat(input_layernorm(embed(tok)), hidden_norm(h))          width 2H
    h1      = h + o_proj(attn(rope(q(x)), rope(k(x)), v(x)))
    h2      = h1 + down(silu(gate(n)) * up(n)),  n = post_attention_layernorm(h1)
    logits  = lm_head(norm(h2))                            over the draft vocab
    next h  = h2                                           (pre-norm, as SGLang passes it on)

With `norm_before_residual` (speculators' variant) the residual stream starts from hidden_norm(h):
h1 = hidden_norm(h) + o_proj(...).

Draft ids map to target ids through d2t: target = i + d2t[i]. This module is the oracle that the
fused `draft_step` op is tested against: keep it plain and exact.

Two entry points share the same weights and math:
- `ttt_step`: a whole sequence at once for training-time test (TTT) step k; queries attend to the
  step-0 keys causally plus, at their own position, the keys of steps 1..k (what a decode-time
  KV cache holds after k draft steps);
- `draft_step`: one token per batch row against a KV cache that it updates in place.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from drafter_lab.drafter.config import DrafterConfig


def upcast(x: torch.Tensor) -> torch.Tensor:
    """At least fp32 for norms, softmax and RoPE (bf16/fp16 go up to fp32; fp64 stays fp64)."""
    return x if x.dtype == torch.float64 else x.float()


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = upcast(x)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None, device=None, dtype=torch.float32):
    """The head_dim/2 rotation frequencies, scaled as DrafterConfig.rope_scaling says.

    llama3 keeps the fast frequencies (wavelength under original_max / high_freq_factor), divides the
    slow ones (over original_max / low_freq_factor) by `factor`, and blends linearly in between.
    """
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=dtype) / head_dim))
    if scaling is None:
        return inv
    if scaling["rope_type"] == "linear":
        return inv / scaling["factor"]
    # Rotations per original context: above high_freq_factor kept, below low_freq_factor scaled.
    turns = scaling["original_max_position_embeddings"] * inv / (2 * math.pi)
    keep = ((turns - scaling["low_freq_factor"]) / (scaling["high_freq_factor"] - scaling["low_freq_factor"])).clamp(0, 1)
    return keep * inv + (1 - keep) * inv / scaling["factor"]


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype=torch.float32, scaling: dict | None = None):
    """cos/sin of shape positions.shape + [head_dim] (HF Llama's rotate_half layout)."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    inv = rope_inv_freq(head_dim, theta, scaling, positions.device, work)
    freqs = positions.to(work)[..., None] * inv
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        h2, d = 2 * cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h2, cfg.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(h2, cfg.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(h2, cfg.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * d, cfg.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """x [..., T, 2H], positions [..., T] -> q [.., nh, T, d], k/v [.., nkv, T, d] (RoPE applied)."""
        c = self.cfg
        shape = x.shape[:-1]
        q = self.q_proj(x).view(*shape, c.num_attention_heads, c.head_dim).transpose(-2, -3)
        k = self.k_proj(x).view(*shape, c.num_key_value_heads, c.head_dim).transpose(-2, -3)
        v = self.v_proj(x).view(*shape, c.num_key_value_heads, c.head_dim).transpose(-2, -3)
        cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta, q.dtype, c.rope_scaling)
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def expand_kv(self, t: torch.Tensor) -> torch.Tensor:
        rep = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        return t.repeat_interleave(rep, dim=-3) if rep > 1 else t


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        self.norm_before_residual = cfg.norm_before_residual

    def attn_input(self, embeds: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention's input cat(input_layernorm(e), hidden_norm(h)), and the residual stream's start
        (h; hidden_norm(h) with norm_before_residual)."""
        normed = self.hidden_norm(hidden)
        x = torch.cat([self.input_layernorm(embeds), normed], -1)
        return x, normed if self.norm_before_residual else hidden

    def finish(self, residual: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """o_proj + residual, then the MLP block with its residual."""
        h1 = residual + self.self_attn.o_proj(attn_out)
        return h1 + self.mlp(self.post_attention_layernorm(h1))


def state_shapes(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Eagle3Drafter's state_dict shapes, by arithmetic on the config: a checkpoint's tensors are checked
    against them before anything of the config's sizes is built (an absurd size allocated first, and on
    "meta" too large a size overflows). Kept in step with the modules by tests/drafter/test_config_sizes_review3.py."""
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    mid = {"input_layernorm.weight": (h,), "hidden_norm.weight": (h,), "self_attn.q_proj.weight": (q, 2 * h),
           "self_attn.k_proj.weight": (kv, 2 * h), "self_attn.v_proj.weight": (kv, 2 * h),
           "self_attn.o_proj.weight": (h, q), "post_attention_layernorm.weight": (h,),
           "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h), "mlp.down_proj.weight": (h, inter)}
    return {"d2t": (cfg.draft_vocab_size,), "t2d": (cfg.target_vocab_size,),
            "embed_tokens.weight": (cfg.target_vocab_size, h), "fc.weight": (h, 3 * cfg.target_hidden_size),
            **{f"midlayer.{k}": v for k, v in mid.items()}, "norm.weight": (h,),
            "lm_head.weight": (cfg.draft_vocab_size, h)}


class Eagle3Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.target_vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(3 * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.target_vocab_size, dtype=torch.bool))

    # -- pieces -------------------------------------------------------------------------------
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(token_ids)

    def project(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """fc over the concatenated aux states [..., 3*H_t] -> [..., H]."""
        return self.fc(aux_hidden.to(self.fc.weight.dtype))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocab logits from the pre-norm hidden state."""
        return self.lm_head(self.norm(hidden))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    # -- training-time test ---------------------------------------------------------------------
    def ttt_step(self, embeds, hidden, positions, cache: list):
        """One TTT step over whole sequences.

        embeds, hidden: [B, T, H]; positions: [B, T]. Padding needs no key mask: the loss never reads a padded
        position, and causal attention keeps real positions from seeing the padding after them.
        `cache` holds (k, v) of the earlier steps and is extended with this step's.
        Returns the new pre-norm hidden state [B, T, H].
        """
        layer = self.midlayer
        attn = layer.self_attn
        x, residual = layer.attn_input(embeds, hidden)
        q, k, v = attn.qkv(x, positions)
        cache.append((k, v))
        B, T = embeds.shape[:2]
        scale = attn.cfg.head_dim ** -0.5
        k0, v0 = attn.expand_kv(cache[0][0]), attn.expand_kv(cache[0][1])
        scores = [torch.matmul(q, k0.transpose(-1, -2)) * scale]  # [B, nh, T, T]
        allowed = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        scores[0] = scores[0].masked_fill(~allowed, torch.finfo(scores[0].dtype).min)
        diag_v = []
        for kj, vj in cache[1:]:
            scores.append(((q * attn.expand_kv(kj)).sum(-1) * scale)[..., None])  # [B, nh, T, 1]
            diag_v.append(attn.expand_kv(vj))
        probs = torch.softmax(upcast(torch.cat(scores, -1)), -1).to(q.dtype)
        out = torch.matmul(probs[..., :T], v0)
        for j, vj in enumerate(diag_v):
            out = out + probs[..., T + j, None] * vj
        out = out.transpose(1, 2).reshape(B, T, -1)
        return layer.finish(residual, out)

    # -- decoding -------------------------------------------------------------------------------
    def draft_step(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        cache_lens: torch.Tensor,
        topk: int,
    ):
        """One draft token per row against a KV cache (the fused op's oracle).

        embeds [B, H]; hidden [B, 3*H_t] (first step: goes through fc) or [B, H];
        positions [B] (RoPE); k_cache/v_cache [B, n_kv, S, d], written in place at cache_lens[b];
        the row attends to entries 0..cache_lens[b]. Returns (hidden_out [B, H] pre-norm,
        topk target ids [B, topk], their log-probs over the draft vocab [B, topk]).
        """
        if hidden.shape[-1] == 3 * self.config.target_hidden_size and hidden.shape[-1] != self.config.hidden_size:
            hidden = self.project(hidden)
        elif hidden.shape[-1] != self.config.hidden_size:
            raise ValueError(f"hidden has width {hidden.shape[-1]}, want {self.config.hidden_size} or 3*H_t")
        layer = self.midlayer
        attn = layer.self_attn
        x, residual = layer.attn_input(embeds, hidden)
        q, k, v = attn.qkv(x[:, None], positions[:, None])  # [B, h, 1, d]
        B = embeds.shape[0]
        rows = torch.arange(B, device=embeds.device)
        k_cache[rows, :, cache_lens] = k[:, :, 0].to(k_cache.dtype)
        v_cache[rows, :, cache_lens] = v[:, :, 0].to(v_cache.dtype)
        S = k_cache.shape[2]
        valid = torch.arange(S, device=embeds.device)[None] <= cache_lens[:, None]  # [B, S]
        kk = attn.expand_kv(k_cache.to(q.dtype))
        # entries past cache_lens get probability 0, but 0 * inf (or NaN) is NaN: stale entries are zeroed
        vv = attn.expand_kv(v_cache.to(q.dtype)).masked_fill(~valid[:, None, :, None], 0)
        scores = torch.matmul(q, kk.transpose(-1, -2)) * attn.cfg.head_dim ** -0.5  # [B, nh, 1, S]
        scores = scores.masked_fill(~valid[:, None, None, :], torch.finfo(scores.dtype).min)
        probs = torch.softmax(upcast(scores), -1).to(q.dtype)
        out = torch.matmul(probs, vv)[:, :, 0].reshape(B, -1)
        h = layer.finish(residual, out)
        logp = torch.log_softmax(upcast(self.logits(h)), -1)
        top_logp, top = logp.topk(topk, -1)
        return h, self.to_target_ids(top), top_logp

    def new_kv_cache(self, batch: int, max_len: int, dtype=None, device=None):
        c = self.config
        dtype = dtype or self.fc.weight.dtype
        device = device or self.fc.weight.device
        shape = (batch, c.num_key_value_heads, max_len, c.head_dim)
        return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)
