"""drafter_lab::draft_step against its oracle, Eagle3Drafter.draft_step (DESIGN sections 4 and 6).

Every case draws a fresh random drafter and inputs, runs the reference in the op's dtype and in
fp64, and runs the op on a copy of the KV cache whose unused entries (this step's slot and
everything past it) are NaN, so that a kernel reading past cache_lens[b] or skipping the write
shows. On CUDA the caching allocator is filled with NaN first, so unwritten outputs show too.
The CPU cases are small and run in CI; the `gpu` cases cover the full ranges of the issue.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.errors import LabError
from drafter_lab.kernels import draft_step as ds

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Relative error allowed against the reference in the same dtype (DESIGN section 6).
REL_TOL = {torch.float32: 2e-5, torch.bfloat16: 1.5e-2, torch.float16: 4e-3}
# Smallest log-prob tolerance; the effective one also scales with the reference's own error.
LOGP_FLOOR = {torch.float32: 5e-4, torch.bfloat16: 3e-2, torch.float16: 8e-3}
# The op's error against fp64 may exceed plain PyTorch's in the same dtype by at most this factor
# (plus a slack far below the dtype's rounding): "no worse than plain PyTorch".
NO_WORSE = 1.5
NO_WORSE_SLACK = {torch.float32: 5e-6, torch.bfloat16: 1e-3, torch.float16: 2e-4}


@dataclass(frozen=True)
class Shape:
    batch: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    target_hidden: int
    context: int  # longest cache_lens[b]; S = context + 1 + slack
    topk: int
    fc: bool

    def __str__(self) -> str:
        return (f"B{self.batch}-H{self.hidden}-h{self.heads}/{self.kv_heads}x{self.head_dim}-I{self.inter}"
                f"-N{self.vocab}-ctx{self.context}-k{self.topk}-{'fc' if self.fc else 'nofc'}")


def draw_shape(rng: random.Random, *, hidden, batch, context, vocab, fc: bool | None = None) -> Shape:
    """A random drafter shape: hidden a multiple of 64, GQA or MHA, head_dim 64 or 128."""
    head_dim = rng.choice([64, 128])
    hidden_size = rng.randrange(hidden[0], hidden[1] + 1, 64)
    heads = max(1, min(64, hidden_size // head_dim + rng.choice([-1, 0, 0, 1])))
    kv_heads = rng.choice([d for d in range(1, heads + 1) if heads % d == 0 and heads // d <= 8])
    return Shape(
        batch=rng.randint(*batch),
        hidden=hidden_size,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        inter=64 * max(1, round(hidden_size * rng.uniform(2.0, 3.5) / 64)),
        vocab=rng.randint(*vocab),
        target_hidden=64 * max(1, round(hidden_size * rng.uniform(0.5, 1.5) / 64)),
        context=rng.randint(*context),
        topk=rng.randint(1, 8),
        fc=rng.random() < 0.5 if fc is None else fc,
    )


LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
"""Llama-3.1's RoPE scaling: positions up to 4160 turn its blended and scaled frequencies far enough to show."""


def make_drafter(shape: Shape, seed: int, device) -> Eagle3Drafter:
    """fp32 drafter with every weight random (norm weights too) and an injective d2t; by seed, plain,
    llama3-scaled or linearly scaled RoPE."""
    gen = torch.Generator(device=device).manual_seed(seed)
    cfg = DrafterConfig(
        hidden_size=shape.hidden, intermediate_size=shape.inter, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, draft_vocab_size=shape.vocab,
        target_vocab_size=shape.vocab + 1 + seed % 5000, target_hidden_size=shape.target_hidden,
        rope_theta=[10000.0, 500000.0][seed % 2], rms_norm_eps=[1e-6, 1e-5][seed % 3 == 0],
        rope_scaling=[None, LLAMA31_ROPE, None, {"rope_type": "linear", "factor": 4.0}][seed % 4],
    )
    with torch.device(device):
        drafter = Eagle3Drafter(cfg)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen, device=device))
            elif name == "lm_head.weight":
                p.copy_(torch.randn(p.shape, generator=gen, device=device) * (2.5 / p.shape[1] ** 0.5))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen, device=device) / p.shape[1] ** 0.5)
        used = torch.randperm(cfg.target_vocab_size, generator=gen, device=device)[: shape.vocab].sort().values
        drafter.d2t.copy_(used - torch.arange(shape.vocab, device=device))
        drafter.t2d.zero_()
        drafter.t2d[used] = True
    return drafter.eval()


@dataclass
class Inputs:
    embeds: torch.Tensor
    hidden: torch.Tensor
    positions: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cache_lens: torch.Tensor

    def to(self, dtype) -> Inputs:
        f = lambda t: t.to(dtype)  # noqa: E731
        return Inputs(f(self.embeds), f(self.hidden), self.positions.clone(), f(self.k_cache),
                      f(self.v_cache), self.cache_lens.clone())


def make_inputs(shape: Shape, seed: int, device, dtype, *, index_dtype=torch.int64) -> Inputs:
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    B, S = shape.batch, shape.context + 1 + seed % 7
    lens = torch.randint(0, shape.context + 1, (B,), generator=gen, device=device)
    lens[seed % B] = shape.context  # the longest row reaches the drawn context
    positions = torch.where(torch.rand(B, generator=gen, device=device) < 0.5, lens,
                            torch.randint(0, 4096 + 64, (B,), generator=gen, device=device))
    width = 3 * shape.target_hidden if shape.fc else shape.hidden
    cache = (B, shape.kv_heads, S, shape.head_dim)
    rnd = lambda *s, scale=1.0: (torch.randn(s, generator=gen, device=device) * scale).to(dtype)  # noqa: E731
    return Inputs(rnd(B, shape.hidden), rnd(B, width, scale=2.0), positions.to(index_dtype), rnd(*cache),
                  rnd(*cache), lens.to(index_dtype))


def poison_cache(cache: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """A copy whose entries cache_lens[b] and later are NaN (the op writes the first, reads none after)."""
    out = cache.clone()
    for b, n in enumerate(lens.tolist()):
        out[b, :, n:] = float("nan")
    return out


def poison_allocator(device) -> None:
    """Fill the CUDA caching allocator's free blocks with NaN bytes so unwritten outputs show."""
    if torch.device(device).type != "cuda":
        return
    blocks = [torch.full((n,), -1, dtype=torch.int32, device=device)
              for n in (1 << 8, 1 << 12, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24) for _ in range(4)]
    del blocks


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def full_logp(drafter: Eagle3Drafter, h: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(drafter.logits(h).double(), -1)


def check_step(shape: Shape, dtype, device, seed: int, *, index_dtype=torch.int64) -> dict:
    """Run op and references for one case and assert the DESIGN section 6 criteria; returns errors."""
    master = make_drafter(shape, seed, device)
    drafter = copy.deepcopy(master).to(dtype)
    ref64 = copy.deepcopy(drafter).double()
    inp = make_inputs(shape, seed, device, dtype, index_dtype=index_dtype)
    lens, topk = inp.cache_lens, shape.topk
    rows = torch.arange(shape.batch, device=device)

    k_ref, v_ref = inp.k_cache.clone(), inp.v_cache.clone()
    k_op, v_op = poison_cache(inp.k_cache, lens), poison_cache(inp.v_cache, lens)
    i64 = inp.to(torch.float64)
    k64, v64 = i64.k_cache, i64.v_cache
    with torch.no_grad():
        h_ref, ids_ref, lp_ref = drafter.draft_step(inp.embeds, inp.hidden, inp.positions, k_ref, v_ref, lens, topk)
        h64, _, _ = ref64.draft_step(i64.embeds, i64.hidden, i64.positions, k64, v64, lens, topk)
        poison_allocator(device)
        h_op, ids_op, lp_op = ds.draft_step(drafter, inp.embeds, inp.hidden, inp.positions, k_op, v_op, lens, topk,
                                            use_fused=True)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)

    assert h_op.shape == h_ref.shape and h_op.dtype == dtype
    assert ids_op.shape == (shape.batch, topk) and ids_op.dtype == torch.int64
    assert lp_op.shape == (shape.batch, topk) and lp_op.dtype == torch.float32
    assert torch.isfinite(h_op).all() and torch.isfinite(lp_op).all()

    # hidden_out: close to the same-dtype reference, and no further from fp64 than it is.
    err = {"h_vs_ref": rel(h_op, h_ref), "h_vs_64": rel(h_op, h64), "ref_vs_64": rel(h_ref, h64)}
    assert err["h_vs_ref"] <= REL_TOL[dtype], err
    assert err["h_vs_64"] <= NO_WORSE * err["ref_vs_64"] + NO_WORSE_SLACK[dtype], err

    # KV cache: the slot at cache_lens[b] matches, earlier entries untouched, later ones never written.
    for name, c_op, c_ref, c_orig in (("k", k_op, k_ref, inp.k_cache), ("v", v_op, v_ref, inp.v_cache)):
        slot_op, slot_ref = c_op[rows, :, lens], c_ref[rows, :, lens]
        err[f"{name}_slot"] = rel(slot_op, slot_ref)
        assert err[f"{name}_slot"] <= REL_TOL[dtype], (name, err)
        for b, n in enumerate(lens.tolist()):
            assert torch.equal(c_op[b, :, :n], c_orig[b, :, :n]), f"{name}_cache[{b}] changed before the slot"
            assert torch.isnan(c_op[b, :, n + 1:]).all(), f"{name}_cache[{b}] written past the slot"

    # top-k: values against the reference's, ids against fp64 truth with a margin for near-ties.
    lp64 = full_logp(ref64, h64)
    lp_same = full_logp(drafter, h_ref)
    truth_top = lp64.topk(min(topk + 8, shape.vocab), -1).indices
    noise = (lp_same.gather(1, truth_top) - lp64.gather(1, truth_top)).abs().max().item()
    tol = max(LOGP_FLOOR[dtype], 3 * noise)
    err["logp_vs_ref"] = (lp_op.double() - lp_ref.double()).abs().max().item()
    assert err["logp_vs_ref"] <= tol, (err, tol)
    assert (lp_op[:, 1:] <= lp_op[:, :-1]).all(), "top-k log-probs are not sorted"
    target_to_draft = torch.full((master.config.target_vocab_size,), -1, dtype=torch.int64, device=device)
    target_to_draft[torch.arange(shape.vocab, device=device) + master.d2t] = torch.arange(shape.vocab, device=device)
    draft_ids = target_to_draft[ids_op]
    assert (draft_ids >= 0).all(), "returned ids are not d2t images of draft ids"
    assert rel(draft_ids + master.d2t[draft_ids], ids_op) == 0
    kth = lp64.topk(topk, -1).values[:, -1:]
    picked = lp64.gather(1, draft_ids)
    assert (picked >= kth - tol).all(), "op picked an id clearly outside the top-k"
    sure = lp64 > kth + tol
    for b in range(shape.batch):
        must = set(sure[b].nonzero().flatten().tolist())
        assert must <= set(draft_ids[b].tolist()), f"row {b}: op missed ids clearly inside the top-k"
    err["logp_vs_truth"] = (lp_op.double() - picked).abs().max().item()
    assert err["logp_vs_truth"] <= tol + 3 * noise + LOGP_FLOOR[dtype], (err, tol)
    assert (ids_ref.shape == ids_op.shape) and torch.isfinite(lp_ref).all()
    return err


# --- CPU: small random draws, every dtype, with and without fc ----------------------------------------
CPU_LIMITS = dict(hidden=(128, 448), batch=(1, 5), context=(0, 160), vocab=(1000, 3000))
CPU_CASES = [(dt, fc, seed) for dt in DTYPES for fc in (True, False) for seed in (11, 12, 13)]


@pytest.mark.parametrize("dtype_name,fc,seed", CPU_CASES, ids=[f"{d}-{'fc' if f else 'nofc'}-{s}" for d, f, s in CPU_CASES])
def test_cpu_op_matches_reference(dtype_name, fc, seed, require_draft_step_op):
    require_draft_step_op("cpu")
    shape = draw_shape(random.Random(seed * 7 + fc), fc=fc, **CPU_LIMITS)
    check_step(shape, DTYPES[dtype_name], "cpu", seed)


def test_cpu_op_edges(require_draft_step_op):
    """Context 0 everywhere, top-1, MQA (8 query heads on 1 kv head), head_dim 128, int32 indices; odd widths."""
    require_draft_step_op("cpu")
    shape = Shape(batch=3, hidden=256, heads=8, kv_heads=1, head_dim=128, inter=512, vocab=1024,
                  target_hidden=128, context=0, topk=1, fc=True)
    check_step(shape, torch.bfloat16, "cpu", 5, index_dtype=torch.int32)
    shape = Shape(batch=1, hidden=192, heads=3, kv_heads=3, head_dim=64, inter=448, vocab=1001,
                  target_hidden=192, context=37, topk=8, fc=False)
    check_step(shape, torch.float32, "cpu", 6)
    # Batch 1 with reduction lengths that leave the 32-wide and 8-wide loops a tail (fc 252, qkv 200, down 300).
    shape = Shape(batch=1, hidden=100, heads=2, kv_heads=1, head_dim=64, inter=300, vocab=1000,
                  target_hidden=84, context=5, topk=4, fc=True)
    for dtype in (torch.float32, torch.bfloat16):
        check_step(shape, dtype, "cpu", 7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cpu_op_rows_do_not_depend_on_the_batch(dtype, require_draft_step_op):
    """Each row of a batch-5 step equals that row stepped alone, bit for bit: batch 1 reads eight
    weight rows at a time and larger batches two, summing in one order (widths with tails: fc 252,
    q 128, o 128, down 300, a vocab of 1001 leaving a short last group)."""
    require_draft_step_op("cpu")
    shape = Shape(batch=5, hidden=100, heads=2, kv_heads=1, head_dim=64, inter=300, vocab=1001,
                  target_hidden=84, context=9, topk=4, fc=True)
    drafter = make_drafter(shape, 8, "cpu").to(dtype)
    inp = make_inputs(shape, 8, "cpu", dtype)
    k, v = inp.k_cache.clone(), inp.v_cache.clone()
    with torch.no_grad():
        whole = ds.draft_step(drafter, inp.embeds, inp.hidden, inp.positions, k, v, inp.cache_lens, 4,
                              use_fused=True)
        for b in range(shape.batch):
            one = slice(b, b + 1)
            kb, vb = inp.k_cache[one].clone(), inp.v_cache[one].clone()
            alone = ds.draft_step(drafter, inp.embeds[one], inp.hidden[one], inp.positions[one], kb, vb,
                                  inp.cache_lens[one], 4, use_fused=True)
            for name, a, w in zip(("hidden", "ids", "logp"), alone, whole):
                assert torch.equal(a[0], w[b]), f"row {b}: {name} differs stepped alone"
            assert torch.equal(kb[0], k[b]) and torch.equal(vb[0], v[b]), f"row {b}: cache differs"


def test_cpu_isa_follows_the_cpu_flags(require_draft_step_op):
    """The AVX2 build of the CPU loops runs wherever the CPU has AVX2, FMA and F16C, whatever its model."""
    require_draft_step_op("cpu")
    import platform

    from drafter_lab.kernels import _ext

    cpuinfo = Path("/proc/cpuinfo")
    if platform.machine() != "x86_64" or not cpuinfo.exists():
        assert _ext.cpu_isa() == "portable"
        return
    flags = next(line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")).split()
    want = "avx2" if {"avx2", "fma", "f16c"} <= set(flags) else "portable"
    assert _ext.cpu_isa() == want


def test_cpu_op_rejects_bad_input(require_draft_step_op):
    require_draft_step_op("cpu")
    shape = Shape(batch=2, hidden=128, heads=2, kv_heads=1, head_dim=64, inter=256, vocab=1000,
                  target_hidden=64, context=4, topk=2, fc=False)
    drafter = make_drafter(shape, 3, "cpu")
    inp = make_inputs(shape, 3, "cpu", torch.float32)
    S = inp.k_cache.shape[2]
    bad_lens = torch.tensor([0, S])
    with pytest.raises(RuntimeError, match="outside the cache"):
        ds.draft_step(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache, inp.v_cache, bad_lens, 2,
                      use_fused=True)
    with pytest.raises(RuntimeError, match="topk"):
        ds.draft_step(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache, inp.v_cache, inp.cache_lens,
                      shape.vocab + 1, use_fused=True)
    args = list(ds.op_args(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache, inp.v_cache,
                           inp.cache_lens, 2))
    inv = args[-2]
    for bad, match in ((inv[:-1], r"rope_inv_freq has shape \[31\], want \[32\]"),
                       (inv.double(), "rope_inv_freq must be a contiguous float32 vector")):
        args[-2] = bad
        with pytest.raises(RuntimeError, match=match):
            torch.ops.drafter_lab.draft_step(*args)
    with pytest.raises(RuntimeError, match="must be"):
        ds.draft_step(drafter, inp.embeds.double(), inp.hidden, inp.positions, inp.k_cache, inp.v_cache,
                      inp.cache_lens, 2, use_fused=True)


def test_face_dispatch(monkeypatch):
    """None and False run the reference on CPU (bit for bit); True runs the op or refuses clearly."""
    shape = Shape(batch=2, hidden=128, heads=2, kv_heads=2, head_dim=64, inter=192, vocab=1000,
                  target_hidden=64, context=6, topk=3, fc=True)
    drafter = make_drafter(shape, 4, "cpu")
    inp = make_inputs(shape, 4, "cpu", torch.float32)

    def run(**kw):
        k, v = inp.k_cache.clone(), inp.v_cache.clone()
        return ds.draft_step(drafter, inp.embeds, inp.hidden, inp.positions, k, v, inp.cache_lens, 3, **kw)

    with torch.no_grad():
        ref = drafter.draft_step(inp.embeds, inp.hidden, inp.positions, inp.k_cache.clone(), inp.v_cache.clone(),
                                 inp.cache_lens, 3)
        for kw in ({}, {"use_fused": False}):
            out = run(**kw)
            assert all(torch.equal(a, b) for a, b in zip(out, ref))
        monkeypatch.setattr(ds, "_load", lambda: "drafter_lab._C is not built (test)")
        with pytest.raises(LabError, match="unavailable"):
            run(use_fused=True)
        assert not ds.available()
    with pytest.raises(ValueError, match="width"):
        ds.op_args(drafter, inp.embeds, inp.hidden[:, :5], inp.positions, inp.k_cache, inp.v_cache,
                   inp.cache_lens, 3)


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of `t` one element past a 16-byte boundary (a view into a larger buffer)."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    out = buf[1:].view(t.shape)
    out.copy_(t)
    assert out.is_contiguous() and out.data_ptr() % 16 != 0
    return out


def test_cuda_supports():
    """The default path falls back to the reference for what the CUDA kernels do not take (the op
    would raise on it)."""
    shape = Shape(batch=2, hidden=128, heads=2, kv_heads=2, head_dim=64, inter=192, vocab=1000,
                  target_hidden=64, context=6, topk=3, fc=True)
    drafter = make_drafter(shape, 4, "cpu")
    inp = make_inputs(shape, 4, "cpu", torch.float32)
    k, v = inp.k_cache, inp.v_cache
    assert ds.cuda_supports(drafter, inp.embeds, inp.hidden, k, v, 3)
    assert not ds.cuda_supports(drafter, inp.embeds, inp.hidden, k, v, 17)
    assert not ds.cuda_supports(drafter, inp.embeds.bfloat16(), inp.hidden, k, v, 3)
    assert not ds.cuda_supports(drafter, inp.embeds, inp.hidden[:, :100], k, v, 3)
    assert not ds.cuda_supports(drafter, inp.embeds, inp.hidden, k, v.bfloat16(), 3)
    assert not ds.cuda_supports(drafter, inp.embeds, inp.hidden, k.transpose(2, 3).contiguous().transpose(2, 3), v, 3)
    assert not ds.cuda_supports(drafter, inp.embeds, inp.hidden, k, _misaligned(v), 3)  # the op: "16-byte aligned"
    o_proj = drafter.midlayer.self_attn.o_proj.weight
    o_proj.data = _misaligned(o_proj.data)
    assert not ds.cuda_supports(drafter, inp.embeds, inp.hidden, k, v, 3)
    drafter = make_drafter(shape, 4, "cpu")
    with torch.no_grad():
        drafter.midlayer.mlp.up_proj.weight.data = drafter.midlayer.mlp.up_proj.weight.data.half()  # mixed weights
    assert not ds.cuda_supports(drafter, inp.embeds, inp.hidden, k, v, 3)
    drafter = make_drafter(shape, 4, "cpu")
    drafter.midlayer.self_attn.q_proj.weight.data = drafter.midlayer.self_attn.q_proj.weight.data.t().contiguous().t()
    assert not ds.cuda_supports(drafter, inp.embeds, inp.hidden, k, v, 3)
    odd = make_drafter(Shape(**{**shape.__dict__, "heads": 1, "kv_heads": 1, "head_dim": 96}), 4, "cpu")
    assert not ds.cuda_supports(odd, inp.embeds, inp.hidden, k, v, 3)
    drafter = make_drafter(shape, 4, "cpu")
    drafter.config.norm_before_residual = True  # speculators' variant: the kernels run plain EAGLE-3 only
    assert not ds.cuda_supports(drafter, inp.embeds, inp.hidden, k, v, 3)


def test_a_drafter_the_kernels_do_not_implement_drafts_on_the_reference_from_the_start(monkeypatch):
    """On CUDA with the op built, `auto` picks the reference for such a drafter up front, so the eval
    neither reports a fused draft step nor hands the reference whole caches."""
    from drafter_lab.spec.drafting import resolve_step

    monkeypatch.setattr(ds, "available", lambda device=None: True)
    shape = Shape(batch=2, hidden=128, heads=2, kv_heads=2, head_dim=64, inter=192, vocab=1000,
                  target_hidden=64, context=6, topk=3, fc=True)
    for over, fused in (({}, True), ({"norm_before_residual": True}, False), ({"head_dim": 96}, False),
                        ({"intermediate_size": 200}, False), ({"rope_scaling": LLAMA31_ROPE}, True)):
        cfg = dataclasses.replace(make_drafter(shape, 4, "cpu").config, **over)
        cuda_weight = SimpleNamespace(device=torch.device("cuda"))
        on_cuda = SimpleNamespace(config=cfg, fc=SimpleNamespace(weight=cuda_weight), draft_step="reference")
        step, got = resolve_step(on_cuda, None)
        assert got is fused and (step == "reference") is not fused, over


def test_the_op_refuses_norm_before_residual(require_draft_step_op):
    require_draft_step_op("cpu")
    shape = Shape(batch=2, hidden=128, heads=2, kv_heads=1, head_dim=64, inter=256, vocab=1000,
                  target_hidden=64, context=4, topk=2, fc=False)
    drafter = make_drafter(shape, 3, "cpu")
    drafter.config.norm_before_residual = drafter.midlayer.norm_before_residual = True
    inp = make_inputs(shape, 3, "cpu", torch.float32)
    with pytest.raises(LabError, match="runs plain EAGLE-3; this drafter is norm_before_residual"):
        ds.draft_step(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache, inp.v_cache, inp.cache_lens, 2,
                      use_fused=True)


def _opcheck(device, dtype):
    shape = Shape(batch=2, hidden=128, heads=4, kv_heads=2, head_dim=64, inter=256, vocab=1000,
                  target_hidden=64, context=9, topk=4, fc=True)
    drafter = make_drafter(shape, 8, device).to(dtype)
    inp = make_inputs(shape, 8, device, dtype)
    args = ds.op_args(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache, inp.v_cache, inp.cache_lens,
                      shape.topk)
    torch.library.opcheck(torch.ops.drafter_lab.draft_step.default, args)


def test_opcheck_cpu(require_draft_step_op):
    require_draft_step_op("cpu")
    _opcheck("cpu", torch.float32)


def test_importing_the_face_registers_the_fake_kernel(require_draft_step_op):
    """torch's error for a traced call without a fake kernel says to import drafter_lab.kernels.draft_step;
    that import alone (nothing calling `available()` first) must then be enough for opcheck."""
    require_draft_step_op("cpu")
    code = "import torch; from tests.kernels.test_draft_step import _opcheck; _opcheck('cpu', torch.float32)"
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2], capture_output=True,
                          text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


# --- CUDA: the full ranges of the issue, named shapes, both batch paths, graphs -------------------------
GPU_LIMITS = dict(hidden=(256, 7168), batch=(1, 64), context=(0, 4096), vocab=(1000, 32000))
GPU_SEEDS = list(range(100, 124))
SMALL = dict(hidden=(256, 512), batch=(1, 20), context=(0, 64), vocab=(1000, 2000))


@pytest.mark.gpu
@pytest.mark.parametrize("seed", GPU_SEEDS)
def test_gpu_fuzz(seed, require_draft_step_op):
    require_draft_step_op("cuda")
    rng = random.Random(seed)
    shape = draw_shape(rng, **GPU_LIMITS)
    dtype = list(DTYPES.values())[seed % 3]
    check_step(shape, dtype, "cuda", seed, index_dtype=[torch.int64, torch.int32][seed % 2])


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [200, 201, 202, 203, 204, 205])
def test_gpu_small(seed, require_draft_step_op):
    """Small draws on both batch paths (<= 16 own kernels, > 16 cuBLAS): the compute-sanitizer set."""
    require_draft_step_op("cuda")
    shape = draw_shape(random.Random(seed), **SMALL)
    check_step(shape, list(DTYPES.values())[seed % 3], "cuda", seed)


NAMED = {
    "llama3.1-8b": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=14336, vocab=32000,
                        target_hidden=4096),
    "kimi-k2": dict(hidden=7168, heads=64, kv_heads=64, head_dim=128, inter=18432, vocab=32000,
                    target_hidden=7168),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(NAMED))
@pytest.mark.parametrize("batch", [1, 8, 32])
def test_gpu_named_shapes(name, batch, require_draft_step_op):
    require_draft_step_op("cuda")
    shape = Shape(batch=batch, context=1024, topk=4, fc=True, **NAMED[name])
    check_step(shape, torch.bfloat16, "cuda", 300 + batch)


# Top-k past 8 (the merge's longest lists) and 8 query heads per kv head (two head blocks in p @ v),
# with caches long enough that a block loads its K/V rows in several tiles and this step's entry lies
# past the first: bf16 on both batch paths, and a small fp32 case (32-key tiles) for the sanitizer.
LONG_TOPK = {
    "bf16-gemv": (Shape(batch=12, hidden=1024, heads=8, kv_heads=1, head_dim=128, inter=2816, vocab=3001,
                        target_hidden=512, context=1500, topk=16, fc=True), torch.bfloat16),
    "bf16-cublas": (Shape(batch=20, hidden=1024, heads=8, kv_heads=1, head_dim=128, inter=2816, vocab=3001,
                          target_hidden=512, context=1500, topk=9, fc=True), torch.bfloat16),
    "fp32-small": (Shape(batch=2, hidden=256, heads=8, kv_heads=1, head_dim=128, inter=704, vocab=1500,
                         target_hidden=256, context=100, topk=12, fc=False), torch.float32),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(LONG_TOPK))
def test_gpu_long_topk_and_wide_gqa(case, require_draft_step_op):
    require_draft_step_op("cuda")
    shape, dtype = LONG_TOPK[case]
    check_step(shape, dtype, "cuda", 400 + shape.topk)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [3, 40])
def test_gpu_graph_replay(batch, require_draft_step_op):
    """Capture the op once, change every input in place, replay: matches the reference on the new inputs."""
    require_draft_step_op("cuda")
    shape = Shape(batch=batch, hidden=512, heads=8, kv_heads=2, head_dim=64, inter=1408, vocab=5000,
                  target_hidden=256, context=200, topk=5, fc=True)
    drafter = make_drafter(shape, 9, "cuda").to(torch.bfloat16)
    first, second = (make_inputs(shape, s, "cuda", torch.bfloat16) for s in (9, 10))
    S = max(first.k_cache.shape[2], second.k_cache.shape[2])
    static = make_inputs(shape, 9, "cuda", torch.bfloat16)
    static.k_cache = torch.zeros(batch, shape.kv_heads, S, shape.head_dim, dtype=torch.bfloat16, device="cuda")
    static.v_cache = torch.zeros_like(static.k_cache)

    def load(src: Inputs) -> None:
        for name in ("embeds", "hidden", "positions", "cache_lens"):
            getattr(static, name).copy_(getattr(src, name))
        static.k_cache.zero_()
        static.v_cache.zero_()
        static.k_cache[:, :, : src.k_cache.shape[2]].copy_(src.k_cache)
        static.v_cache[:, :, : src.v_cache.shape[2]].copy_(src.v_cache)

    def step():
        return ds.draft_step(drafter, static.embeds, static.hidden, static.positions, static.k_cache,
                             static.v_cache, static.cache_lens, shape.topk, use_fused=True)

    with torch.no_grad():
        load(first)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        load(first)
        with torch.cuda.graph(graph):
            outs = step()
        for src in (second, first):
            load(src)
            k_ref, v_ref = static.k_cache.clone(), static.v_cache.clone()
            ref = drafter.draft_step(static.embeds, static.hidden, static.positions, k_ref, v_ref,
                                     static.cache_lens, shape.topk)
            poison_allocator("cuda")
            graph.replay()
            torch.cuda.synchronize()
            assert rel(outs[0], ref[0]) <= REL_TOL[torch.bfloat16]
            assert (outs[2] - ref[2]).abs().max().item() <= 0.1
            assert rel(static.k_cache, k_ref) <= REL_TOL[torch.bfloat16]
            assert rel(static.v_cache, v_ref) <= REL_TOL[torch.bfloat16]


@pytest.mark.gpu
def test_gpu_bad_cache_len_gives_nan_row(require_draft_step_op):
    """Without a host sync the CUDA op cannot raise: a row whose cache_lens is out of range comes back NaN."""
    require_draft_step_op("cuda")
    shape = Shape(batch=3, hidden=256, heads=4, kv_heads=2, head_dim=64, inter=512, vocab=1000,
                  target_hidden=128, context=8, topk=2, fc=False)
    drafter = make_drafter(shape, 12, "cuda")
    inp = make_inputs(shape, 12, "cuda", torch.float32)
    lens = inp.cache_lens.clone()
    lens[1] = inp.k_cache.shape[2]
    with torch.no_grad():
        h, ids, lp = ds.draft_step(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache, inp.v_cache, lens,
                                   2, use_fused=True)
    assert torch.isnan(h[1]).all() and torch.isnan(lp[1]).all()
    assert torch.isfinite(h[[0, 2]]).all() and torch.isfinite(lp[[0, 2]]).all()
    _assert_drafted(drafter, ids)


def _assert_drafted(drafter: Eagle3Drafter, ids: torch.Tensor) -> None:
    """Every id one of the drafter's draft vocabulary (the next step embeds it)."""
    assert ((ids >= 0) & (ids < drafter.t2d.shape[0])).all(), ids
    assert drafter.t2d[ids.clamp(0, drafter.t2d.shape[0] - 1)].all(), ids


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_row_whose_step_overflows_still_drafts_ids(device, require_draft_step_op):
    """A NaN row (an fp16 drafter's overflow) ranks NaN as -inf: the CUDA kernel found no candidate in it
    and wrote id -1, which the next step embedded out of bounds; the other rows are untouched."""
    require_draft_step_op(device)
    shape = Shape(batch=3, hidden=256, heads=4, kv_heads=2, head_dim=64, inter=512, vocab=1000,
                  target_hidden=128, context=8, topk=4, fc=False)
    drafter = make_drafter(shape, 14, device)
    inp = make_inputs(shape, 14, device, torch.float32)
    inp.embeds[1] = float("nan")
    with torch.no_grad():
        _, ids_ref, lp_ref = drafter.draft_step(inp.embeds, inp.hidden, inp.positions, inp.k_cache.clone(),
                                                inp.v_cache.clone(), inp.cache_lens, 4)
        _, ids, lp = ds.draft_step(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache, inp.v_cache,
                                   inp.cache_lens, 4, use_fused=True)
    assert torch.isnan(lp[1]).all() and torch.isfinite(lp[[0, 2]]).all()
    _assert_drafted(drafter, ids)
    assert torch.equal(ids[[0, 2]], ids_ref[[0, 2]])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_cuda(dtype, require_draft_step_op):
    require_draft_step_op("cuda")
    _opcheck("cuda", dtype)


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph(require_draft_step_op):
    """The fake kernel lets torch.compile trace the op; compiled and eager results agree."""
    require_draft_step_op("cuda")
    shape = Shape(batch=4, hidden=256, heads=4, kv_heads=4, head_dim=64, inter=704, vocab=2000,
                  target_hidden=256, context=30, topk=3, fc=False)
    drafter = make_drafter(shape, 13, "cuda").to(torch.bfloat16)
    inp = make_inputs(shape, 13, "cuda", torch.bfloat16)
    args = ds.op_args(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache, inp.v_cache, inp.cache_lens,
                      shape.topk)

    def f(*a):
        h, ids, lp = torch.ops.drafter_lab.draft_step(*a)
        return h.float() * 2, ids, lp

    k0, v0 = inp.k_cache.clone(), inp.v_cache.clone()
    eager = f(*args)
    inp.k_cache.copy_(k0)
    inp.v_cache.copy_(v0)
    compiled = torch.compile(f, fullgraph=True)(*args)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])
