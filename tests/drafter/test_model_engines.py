"""The reference drafter against the serving engines' EAGLE-3 math, re-derived from their source.

Neither engine installs here, so `Engine` below re-implements, in plain torch and fp64, what they
compute from the files `save_drafter` writes (read from source, not imported):

- SGLang `LlamaForCausalLMEagle3` (python/sglang/srt/models/llama_eagle3.py, llama.py): the loader
  stacks q/k/v into `qkv_proj` and gate/up into `gate_up_proj`, and turns d2t into hot_token_id =
  d2t + arange. `LlamaModel.forward` applies fc only where the hidden state's width differs from the
  embedding's (the first step: aux states; later steps: the drafter's own hidden). The midlayer's
  `LlamaDecoderLayer.forward`: residual = h (before its norm), x = cat(input_layernorm(embed),
  hidden_norm(h)) (2H wide, embeds first), attention with neox (rotate_half) RoPE from `get_rope`
  (rope_theta, llama3 or linear scaling) and scale head_dim^-0.5, then the fused add-norms:
  post_attention_layernorm(attn, residual), MLP down(SiLU(gate) * up), and norm(mlp, residual), whose
  normed half goes to lm_head and whose pre-norm sum is the hidden state the next draft step gets
  ("For draft decode, we capture the hidden state before norm"). The draft worker takes softmax,
  top-k over the draft vocab, maps ids through hot_token_id, and adds 1 to the positions before each
  draft decode step (the draft extend runs at the committed tokens' own positions).
- vLLM `Eagle3LlamaForCausalLM` (vllm/model_executor/models/llama_eagle3.py): the same math, plus
  config.norm_before_residual (speculators' variant: residual = hidden_norm(h)); compute_logits
  scatters the draft logits to base + draft_id_to_target_id, the same ids.
- SpecForge's training drafter (specforge/modeling/draft/llama3_eagle.py) has the same layer; its
  TTT step k queries step 0's keys causally plus steps 1..k's at their own index, which is what a
  decode cache rooted at that index holds.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from drafter_lab.drafter.checkpoint import save_drafter
from drafter_lab.drafter.config import SGLANG, SPECULATORS

from .test_model import LLAMA3, random_drafter, small_config

P0 = 50  # first position of the prompt: large enough that every RoPE scaling moves the angles


def rms(x, w, eps):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def add_rms(x, residual, w, eps):
    """SGLang's and vLLM's fused RMSNorm(x, residual): (norm(x + residual), x + residual)."""
    s = x + residual
    return rms(s, w, eps), s


def engine_inv_freq(head_dim, base, scaling):
    """get_rope's frequencies: Llama3RotaryEmbedding's wavelength bands (linear scales positions)."""
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scaling and scaling["rope_type"] == "llama3":
        old, lo, hi, f = (scaling[k] for k in ("original_max_position_embeddings", "low_freq_factor",
                                               "high_freq_factor", "factor"))
        wave = 2 * math.pi / inv
        smooth = (old / wave - lo) / (hi - lo)
        inv = torch.where(wave < old / hi, inv, torch.where(wave > old / lo, inv / f, (1 - smooth) * inv / f + smooth * inv))
    return inv


def neox_rope(x, positions, inv, scaling):
    t = positions.double()
    if scaling and scaling["rope_type"] == "linear":
        t = t / scaling["factor"]
    ang = t[:, None, None] * inv  # [m, 1, d/2]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x.chunk(2, -1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class Engine:
    """One request's drafter as SGLang (fmt sglang) or vLLM (fmt speculators) serves the exported files."""

    def __init__(self, path, fmt):
        c = json.loads((path / "config.json").read_text())
        layer = c["transformer_layer_config"] if fmt == SPECULATORS else c
        t = {k: v.double() if v.is_floating_point() else v for k, v in load_file(str(path / "model.safetensors")).items()}
        mid = "layers.0." if fmt == SPECULATORS else "midlayer."
        self.eps, self.theta, self.scaling = layer["rms_norm_eps"], layer["rope_theta"], layer["rope_scaling"]
        self.nh, self.nkv, self.d = layer["num_attention_heads"], layer["num_key_value_heads"], layer["head_dim"]
        # SGLang has no switch for speculators' variant; vLLM reads it from the config
        self.norm_before_residual = fmt == SPECULATORS and bool(c.get("norm_before_residual"))
        self.embed, self.fc, self.norm, self.lm_head = (t[n] for n in ("embed_tokens.weight", "fc.weight",
                                                                       "norm.weight", "lm_head.weight"))
        self.w = {n: t[mid + n] for n in ("input_layernorm.weight", "hidden_norm.weight",
                                          "post_attention_layernorm.weight", "self_attn.o_proj.weight",
                                          "mlp.down_proj.weight")}
        self.qkv = torch.cat([t[mid + f"self_attn.{p}_proj.weight"] for p in "qkv"])
        self.gate_up = torch.cat([t[mid + "mlp.gate_proj.weight"], t[mid + "mlp.up_proj.weight"]])
        self.hot = t["d2t"] + torch.arange(t["d2t"].shape[0])
        self.inv = engine_inv_freq(self.d, self.theta, self.scaling)
        self.kv: dict[int, tuple] = {}  # position -> (k [nkv, d], v [nkv, d])

    def forward(self, ids, hidden, positions, topk):
        """ids [m], hidden [m, 3*H_t or H], positions [m] -> (pre-norm hidden [m, H], logits [m, N],
        top-k target ids [m, k], their probabilities [m, k])."""
        w, eps = self.w, self.eps
        embeds = self.embed[ids]
        if hidden.shape[-1] != embeds.shape[-1]:
            hidden = hidden @ self.fc.T
        normed = rms(hidden, w["hidden_norm.weight"], eps)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([rms(embeds, w["input_layernorm.weight"], eps), normed], -1)
        q, k, v = (x @ self.qkv.T).split([self.nh * self.d, self.nkv * self.d, self.nkv * self.d], -1)
        m = len(ids)
        q = neox_rope(q.view(m, self.nh, self.d), positions, self.inv, self.scaling)
        k = neox_rope(k.view(m, self.nkv, self.d), positions, self.inv, self.scaling)
        for i, p in enumerate(positions.tolist()):
            self.kv[p] = (k[i], v[i].view(self.nkv, self.d))
        out = []
        for i, p in enumerate(positions.tolist()):
            seen = sorted(s for s in self.kv if s <= p)
            ks = torch.stack([self.kv[s][0] for s in seen], 1)  # [nkv, S, d]
            vs = torch.stack([self.kv[s][1] for s in seen], 1)
            group = self.nh // self.nkv  # query head j reads kv head j // group
            ks, vs = ks.repeat_interleave(group, 0), vs.repeat_interleave(group, 0)
            probs = torch.softmax((q[i][:, None] @ ks.transpose(1, 2)) * self.d ** -0.5, -1)  # [nh, 1, S]
            out.append((probs @ vs).reshape(-1))
        attn = torch.stack(out) @ w["self_attn.o_proj.weight"].T
        n, residual = add_rms(attn, residual, w["post_attention_layernorm.weight"], eps)
        gate, up = (n @ self.gate_up.T).chunk(2, -1)
        mlp = (F.silu(gate) * up) @ w["mlp.down_proj.weight"].T
        to_logits, to_next = add_rms(mlp, residual, self.norm, eps)
        logits = to_logits @ self.lm_head.T
        top_p, top = torch.softmax(logits, -1).topk(topk, -1)
        return to_next, logits, self.hot[top], top_p


CASES = [(SGLANG, False, None), (SGLANG, False, LLAMA3), (SGLANG, False, {"rope_type": "linear", "factor": 4.0}),
         (SPECULATORS, True, None), (SPECULATORS, True, LLAMA3)]
IDS = ["sglang", "sglang-llama3", "sglang-linear", "vllm-norm_before_residual", "vllm-norm_before_residual-llama3"]
T, TOPK = 7, 3


def setup(tmp_path, fmt, norm_before_residual, scaling):
    cfg = small_config(norm_before_residual=norm_before_residual, rope_scaling=scaling)
    drafter = random_drafter(cfg, seed=11)
    save_drafter(drafter, tmp_path, fmt=fmt)
    g = torch.Generator().manual_seed(12)
    aux = torch.randn(T, 3 * cfg.target_hidden_size, generator=g, dtype=torch.float64)
    ids = torch.randint(0, cfg.target_vocab_size, (3, T), generator=g)  # step 0's tokens, then steps 1 and 2's
    return drafter, aux, ids


def check(got, want, dtype):
    tol = 1e-10 if dtype == torch.float64 else 2e-4
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("fmt", "norm_before_residual", "scaling"), CASES, ids=IDS)
def test_draft_step_serves_as_the_engine_computes(tmp_path, fmt, norm_before_residual, scaling, dtype):
    """Draft extend over a prompt (step 0, through fc), then two chained draft decode steps."""
    drafter, aux, ids = setup(tmp_path, fmt, norm_before_residual, scaling)
    engine = Engine(tmp_path, fmt)
    d = drafter.to(dtype)
    positions = P0 + torch.arange(T)
    with torch.no_grad():
        h_want, logits, top_want, p_want = engine.forward(ids[0], aux, positions, TOPK)
        kc, vc = d.new_kv_cache(1, T + 2)
        for t in range(T):  # the lab's extend: one position at a time into its cache
            h, top, logp = d.draft_step(d.embed(ids[0, t:t + 1]), aux[t:t + 1].to(dtype), positions[t:t + 1],
                                        kc, vc, torch.tensor([t]), TOPK)
            check(h[0], h_want[t], dtype)
            check(logp[0], p_want[t].log(), dtype)
            assert torch.equal(top[0], top_want[t])
        h_next, tok = h, top[:, 0]
        for step in (1, 2):  # each feeds the previous pre-norm hidden and its own top-1, one position on
            pos = P0 + T - 1 + step
            h_want, _, top_want, p_want = engine.forward(tok, h_next.double(), torch.tensor([pos]), TOPK)
            h_next, top, logp = d.draft_step(d.embed(tok), h_next, torch.tensor([pos]), kc, vc,
                                             torch.tensor([T - 1 + step]), TOPK)
            check(h_next, h_want, dtype)
            check(logp, p_want.log(), dtype)
            assert torch.equal(top, top_want)
            tok = top[:, 0]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("fmt", "norm_before_residual", "scaling"), CASES, ids=IDS)
def test_ttt_steps_are_what_the_engine_drafts_from_each_position(tmp_path, fmt, norm_before_residual, scaling, dtype):
    """TTT step k at index t is the engine's k-th draft decode step after an extend ending at t."""
    drafter, aux, ids = setup(tmp_path, fmt, norm_before_residual, scaling)
    d = drafter.to(dtype)
    positions = (P0 + torch.arange(T))[None]
    with torch.no_grad():
        cache: list = []
        hs = [d.ttt_step(d.embed(ids[None, 0]), d.project(aux[None].to(dtype)), positions, cache)]
        for k in (1, 2):
            hs.append(d.ttt_step(d.embed(ids[None, k]), hs[-1], positions + k, cache))
        for t in range(T):
            engine = Engine(tmp_path, fmt)
            h_want, logits, _, _ = engine.forward(ids[0, :t + 1], aux[:t + 1], positions[0, :t + 1], TOPK)
            h_want, logits = h_want[t:], logits[t:]
            for k in range(3):
                if k:
                    h_want, logits, _, _ = engine.forward(ids[k, t:t + 1], h_want, torch.tensor([P0 + t + k]), TOPK)
                check(hs[k][0, t], h_want[0], dtype)
                check(d.logits(hs[k][0, t]), logits[0], dtype)


def test_the_engine_reference_can_tell_the_residual_variants_apart(tmp_path):
    """The check has teeth: SGLang's plain residual and speculators' variant give other hidden states."""
    drafter, aux, ids = setup(tmp_path, SPECULATORS, True, None)
    engine = Engine(tmp_path, SPECULATORS)
    want = engine.forward(ids[0], aux, P0 + torch.arange(T), TOPK)[0]
    engine.norm_before_residual = False
    engine.kv.clear()
    assert not torch.allclose(engine.forward(ids[0], aux, P0 + torch.arange(T), TOPK)[0], want, atol=1e-3)
