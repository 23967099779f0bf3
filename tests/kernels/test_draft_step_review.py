"""Review of the CPU draft_step op beyond tests/kernels/test_draft_step.py: odd shapes (widths off every
vector and tile multiple, tiny vocabularies, topk equal to the vocabulary), every GQA ratio up to 8,
contexts 0 and 1, positions far from cache_lens with scaled RoPE, exact ties in the logits, and
offset or strided inputs, with the KV write checked to land on cache_lens[b] and nowhere else."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from test_draft_step import DTYPES, Shape, check_step, make_drafter, make_inputs

from drafter_lab.kernels import draft_step as ds


def odd_shape(seed: int) -> Shape:
    rng = random.Random(seed)
    kv = rng.choice([1, 2, 3])
    vocab = rng.choice([1, 2, 7, 33, 257, 1001])
    return Shape(batch=rng.randint(1, 7), hidden=rng.choice([3, 13, 65, 100, 129, 257]),
                 heads=kv * rng.choice([1, 2, 4, 8]), kv_heads=kv, head_dim=rng.choice([64, 128]),
                 inter=rng.choice([1, 17, 77, 130, 300]), vocab=vocab, target_hidden=rng.choice([1, 5, 21, 64]),
                 context=rng.choice([0, 1, 2, 40]), topk=min(vocab, rng.choice([1, 2, 5, vocab])),
                 fc=rng.random() < 0.5)


ODD = [(seed, dt) for seed in range(8) for dt in DTYPES]


@pytest.mark.parametrize("seed,dtype_name", ODD, ids=[f"{s}-{d}" for s, d in ODD])
def test_cpu_odd_shapes(seed, dtype_name, require_draft_step_op):
    """seed % 4 picks plain, llama3 or linear RoPE (make_drafter); indices alternate int64/int32."""
    require_draft_step_op("cpu")
    check_step(odd_shape(seed), DTYPES[dtype_name], "cpu", seed, index_dtype=[torch.int64, torch.int32][seed % 2])


@pytest.mark.parametrize("ratio", [1, 2, 4, 8])
@pytest.mark.parametrize("context", [0, 1])
def test_cpu_gqa_ratios_short_context(ratio, context, require_draft_step_op):
    require_draft_step_op("cpu")
    shape = Shape(batch=4, hidden=200, heads=2 * ratio, kv_heads=2, head_dim=128 if ratio % 4 else 64, inter=300,
                  vocab=301, target_hidden=72, context=context, topk=301 if ratio == 8 else 3, fc=ratio % 2 == 0)
    for dtype in DTYPES.values():
        check_step(shape, dtype, "cpu", ratio * 10 + context)


@pytest.mark.parametrize("seed", [1, 3])  # llama3 and linear RoPE scaling
def test_cpu_far_positions(seed, monkeypatch, require_draft_step_op):
    """Positions (negative, or far past the cache) have nothing to do with cache_lens."""
    require_draft_step_op("cpu")
    import test_draft_step as base  # the module check_step reads make_inputs from

    def far(shape, seed, device, dtype, *, index_dtype=torch.int64):
        inp = make_inputs(shape, seed, device, dtype, index_dtype=index_dtype)
        inp.positions = torch.tensor([-3, 0, 70_000, 1_000_000][: shape.batch], dtype=index_dtype)
        return inp

    monkeypatch.setattr(base, "make_inputs", far)
    shape = Shape(batch=4, hidden=130, heads=4, kv_heads=1, head_dim=128, inter=250, vocab=500,
                  target_hidden=40, context=9, topk=4, fc=True)
    for dtype in DTYPES.values():
        check_step(shape, dtype, "cpu", seed)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_cpu_topk_with_exact_ties(dtype_name, require_draft_step_op):
    """Duplicate lm_head rows give exactly equal logits: the op returns distinct ids, and each one's
    log-prob under the reference is the reference's at that rank, for every topk up to the whole vocab."""
    require_draft_step_op("cpu")
    dtype = DTYPES[dtype_name]
    shape = Shape(batch=3, hidden=100, heads=4, kv_heads=2, head_dim=64, inter=130, vocab=37, target_hidden=21,
                  context=3, topk=37, fc=True)
    drafter = make_drafter(shape, 1, "cpu").to(dtype)
    with torch.no_grad():
        drafter.lm_head.weight[5:10] = drafter.lm_head.weight[0]
        drafter.lm_head.weight[20:] = drafter.lm_head.weight[1]
    inp = make_inputs(shape, 1, "cpu", dtype)
    to_draft = torch.full((drafter.config.target_vocab_size,), -1)
    to_draft[torch.arange(shape.vocab) + drafter.d2t] = torch.arange(shape.vocab)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    for k in (1, 3, 12, 36, 37):
        with torch.no_grad():
            ref = drafter.draft_step(inp.embeds, inp.hidden, inp.positions, inp.k_cache.clone(), inp.v_cache.clone(),
                                     inp.cache_lens, k)
            op = ds.draft_step(drafter, inp.embeds, inp.hidden, inp.positions, inp.k_cache.clone(),
                               inp.v_cache.clone(), inp.cache_lens, k, use_fused=True)
            full = torch.log_softmax(drafter.logits(ref[0]).float(), -1)
        assert (op[2] - ref[2]).abs().max().item() <= tol
        ids = to_draft[op[1]]
        assert (ids >= 0).all() and all(len(set(row)) == k for row in ids.tolist())
        assert (full.gather(1, ids) - ref[2]).abs().max().item() <= tol


def _views(inp, dtype):
    """The same inputs as offset or strided views into larger buffers filled with a sentinel."""
    B, H = inp.embeds.shape
    e = torch.full((B, 3 * H), 7.0, dtype=dtype)
    e[:, H:2 * H] = inp.embeds
    pos = torch.stack([inp.positions.int(), inp.positions.int()], 1)[:, 1]  # int32 positions, int64 lens
    lens = torch.stack([inp.cache_lens, inp.cache_lens], 1)[:, 0]
    bufs = []
    for c in (inp.k_cache, inp.v_cache):
        buf = torch.full((c.numel() + 19,), 77.0, dtype=dtype)
        buf[11:11 + c.numel()] = c.flatten()
        bufs.append(buf)
    k, v = (b[11:11 + inp.k_cache.numel()].view_as(inp.k_cache) for b in bufs)
    return e[:, H:2 * H], inp.hidden.t().contiguous().t(), pos, k, v, lens, bufs


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_cpu_offset_and_strided_inputs(dtype_name, require_draft_step_op):
    """Views work and equal the contiguous call bit for bit; the only cache elements that change, in
    the whole buffers around the cache views, are each row's kv heads at cache_lens[b]."""
    require_draft_step_op("cpu")
    dtype = DTYPES[dtype_name]
    shape = Shape(batch=3, hidden=96, heads=4, kv_heads=2, head_dim=64, inter=130, vocab=41, target_hidden=33,
                  context=5, topk=4, fc=False)
    drafter = make_drafter(shape, 2, "cpu").to(dtype)
    inp = make_inputs(shape, 2, "cpu", dtype)
    inp.cache_lens = torch.tensor([5, 0, 2])
    e, h, pos, k, v, lens, bufs = _views(inp, dtype)
    before = [b.clone() for b in bufs]
    k_ref, v_ref = inp.k_cache.clone(), inp.v_cache.clone()
    with torch.no_grad():
        want = ds.draft_step(drafter, inp.embeds, inp.hidden, inp.positions, k_ref, v_ref, inp.cache_lens, 4,
                             use_fused=True)
        got = ds.draft_step(drafter, e, h, pos, k, v, lens, 4, use_fused=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(k, k_ref) and torch.equal(v, v_ref)
    S, d = inp.k_cache.shape[2], shape.head_dim
    for buf, old in zip(bufs, before):
        changed = (buf != old).nonzero().flatten() - 11
        where = sorted({(int(i) // (shape.kv_heads * S * d), int(i) // d % S) for i in changed})
        assert where == [(0, 5), (1, 0), (2, 2)]
        assert torch.equal(buf[:11], old[:11]) and torch.equal(buf[-8:], old[-8:])


def test_cpu_refuses_layouts_it_cannot_write_or_read(require_draft_step_op):
    """A non-contiguous cache or weight is a clear error, and the caches stay as they were."""
    require_draft_step_op("cpu")
    shape = Shape(batch=2, hidden=96, heads=2, kv_heads=1, head_dim=64, inter=130, vocab=41, target_hidden=33,
                  context=3, topk=2, fc=False)
    drafter = make_drafter(shape, 3, "cpu")
    inp = make_inputs(shape, 3, "cpu", torch.float32)
    k_t = inp.k_cache.transpose(2, 3).contiguous().transpose(2, 3)
    k_old = k_t.clone()
    with torch.no_grad(), pytest.raises(RuntimeError, match="k_cache and v_cache must be contiguous"):
        ds.draft_step(drafter, inp.embeds, inp.hidden, inp.positions, k_t, inp.v_cache, inp.cache_lens, 2,
                      use_fused=True)
    assert torch.equal(k_t, k_old)
    bad = copy.deepcopy(drafter)
    bad.midlayer.mlp.down_proj.weight.data = bad.midlayer.mlp.down_proj.weight.data.t().contiguous().t()
    v_old = inp.v_cache.clone()
    with torch.no_grad(), pytest.raises(RuntimeError, match="weights must be contiguous"):
        ds.draft_step(bad, inp.embeds, inp.hidden, inp.positions, inp.k_cache, inp.v_cache, inp.cache_lens, 2,
                      use_fused=True)
    assert torch.equal(inp.v_cache, v_old)
