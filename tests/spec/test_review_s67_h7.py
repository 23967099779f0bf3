"""Session 67, h7: NaN log-probs in tree drafting, and pins for the drafting, sampling and fused-step faces.

A draft step that overflows (an fp16 drafter's residual stream) gives NaN log-probs for its beam node.
torch ranks NaN above every number, so the NaN children took the beam and the verify tree, ahead of
their own parents: `Candidates.select` kept a child whose parent it had cut, and wrote the orphan's
parent as -1 (the root's mark) at a non-root node.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from drafter_lab.kernels import draft_step as fused_op
from drafter_lab.spec.drafting import DrafterRunner
from drafter_lab.spec.engine import SpecConfig, SpecEngine

from .conftest import make_drafter
from .test_engine import _prefill_and_extend


def _assert_parents_first(tree):
    """Every non-root node's parent is an earlier node (the root's -1 nowhere else)."""
    idx = torch.arange(1, tree.size)
    par = tree.parents[:, 1:]
    assert ((par >= 0) & (par < idx)).all(), tree.parents


def _poisoned_tree(runner, state, poison: float, steps: int, K: int, T: int):
    """draft_tree from `state` with beam node K-1 of row 0 at the first expansion poisoned as an
    overflow would leave it: its hidden state and its children's log-probs set to `poison`."""
    root, h0, top, logp, k, v = state
    runner.k, runner.v = k.clone(), v.clone()
    step, calls = runner.step, []

    def poisoned(*args):
        h, ids, lp = step(*args)
        if not calls:
            h, lp = h.clone(), lp.clone()
            h[K - 1], lp[K - 1] = poison, poison  # row 0's beam nodes are step rows 0..K-1
        calls.append(1)
        return h, ids, lp

    runner.step = poisoned
    try:
        return runner.draft_tree(root, h0, top, logp, steps, K, T)
    finally:
        runner.step = step


def test_nan_log_probs_rank_like_minus_inf_in_the_tree(target, random_drafter, prompts):
    steps, K, T = 3, 3, 4
    runner = DrafterRunner(random_drafter, use_fused=False)
    engine = SpecEngine(target, random_drafter, SpecConfig(steps=steps, topk=K))
    _, root, h0, top, logp = _prefill_and_extend(engine, runner, prompts[:2], K)
    state = (root, h0, top, logp, runner.k.clone(), runner.v.clone())
    nan = _poisoned_tree(runner, state, float("nan"), steps, K, T)
    inf = _poisoned_tree(runner, state, float("-inf"), steps, K, T)
    _assert_parents_first(nan)
    for field in ("tokens", "parents", "depth"):
        assert torch.equal(getattr(nan, field), getattr(inf, field)), field


def test_fp16_drafter_whose_steps_overflow_drafts_whole_trees(target, prompts, monkeypatch):
    """A real overflow: an fp16 drafter with huge output projections turns some beam nodes' steps NaN
    (not all: the guard below). Its trees keep every node's parent, and decoding stays lossless."""
    d = make_drafter(target, seed=0)
    with torch.no_grad():
        for name, w in d.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "lm_head.weight")):
                w.mul_(32000.0)
    d = d.half()
    engine = SpecEngine(target, d, SpecConfig(steps=5, topk=3, draft_tokens=8, max_new_tokens=12,
                                              stop_at_eos=False, use_fused=False))
    partial, trees = [], []
    step = engine.drafter.step
    draft_tree = DrafterRunner.draft_tree

    def spy_step(*args):
        out = step(*args)
        rows = out[2].isnan().all(-1)
        partial.append(bool(rows.any() and not rows.all()))
        return out

    def spy_tree(self, *args):
        trees.append(draft_tree(self, *args))
        return trees[-1]

    monkeypatch.setattr(engine.drafter, "step", spy_step)
    monkeypatch.setattr(DrafterRunner, "draft_tree", spy_tree)
    spec = engine.generate(prompts[:4])
    assert any(partial)  # the guard: some beam nodes overflowed and others did not
    for tree in trees:
        _assert_parents_first(tree)
    assert spec.tokens == engine.generate(prompts[:4], speculative=False).tokens


@pytest.mark.parametrize("k", [1, 3])
def test_a_sampled_chain_whose_step_overflowed_proposes_its_top_k_uniformly(target, random_drafter, prompts, k):
    """A NaN step in a chain at a temperature: multinomial raised on its NaN q (the greedy chain drafts its
    top-1 regardless). The row proposes its top-k uniformly (at k 1 the one-hot it always is); the other
    row samples as before."""
    steps, vocab = 3, target.vocab_size
    runner = DrafterRunner(random_drafter, use_fused=False)
    engine = SpecEngine(target, random_drafter, SpecConfig(steps=steps, temperature=0.8, sample_topk=k))
    _, root, h0, top, logp = _prefill_and_extend(engine, runner, prompts[:2], k)
    k0, v0 = runner.k.clone(), runner.v.clone()
    clean = runner.draft_chain(root, h0, top, logp, steps, 0.8, torch.Generator().manual_seed(0), vocab)
    runner.k, runner.v = k0, v0
    step, outs = runner.step, []

    def poisoned(*args):
        h, ids, lp = step(*args)
        if not outs:
            h, lp = h.clone(), lp.clone()
            h[0], lp[0] = float("nan"), float("nan")
        outs.append(ids)
        return h, ids, lp

    runner.step = poisoned
    tree = runner.draft_chain(root, h0, top, logp, steps, 0.8, torch.Generator().manual_seed(0), vocab)
    q = tree.q[0, 2]
    assert torch.equal(q[outs[0][0]], torch.full((k,), 1.0 / k)) and q.sum() == 1
    assert tree.tokens[0, 2] in outs[0][0]
    torch.testing.assert_close(tree.q[1], clean.q[1])
    assert torch.equal(tree.tokens[1], clean.tokens[1])



def test_the_fused_ops_arguments_name_the_hidden_width_they_refuse(random_drafter):
    """The error names the hidden state's width (its last dimension), not the batch."""
    e, h = torch.zeros(3, random_drafter.config.hidden_size), torch.zeros(3, 5)
    with pytest.raises(ValueError, match=r"hidden has width 5, want"):
        fused_op.op_args(random_drafter, e, h, None, None, None, None, 2)


def test_an_extension_without_the_op_is_a_reason_not_a_registration(require_draft_step_op):
    """Where _C has no draft_step kernel, the face says why (and the forced op is a one-line error) rather
    than registering a fake kernel for an op that is not there. In a fresh process: `_load` runs once."""
    require_draft_step_op("cpu")
    code = (
        "import torch, pytest\n"
        "torch._C._dispatch_has_kernel_for_dispatch_key = lambda op, key: False\n"
        "from drafter_lab.errors import LabError\n"
        "from drafter_lab.kernels import draft_step as ds\n"
        "assert ds._load() == 'drafter_lab._C has no draft_step op', ds._load()\n"
        "assert ds.available() is False\n"
        "with pytest.raises(LabError, match='unavailable: drafter_lab._C has no draft_step op'):\n"
        "    ds.draft_step(None, torch.zeros(1, 8), None, None, None, None, None, 1, use_fused=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2], capture_output=True,
                          text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_op_takes_head_dim_128(random_drafter):
    cfg = dataclasses.replace(random_drafter.config, head_dim=128, hidden_size=256, intermediate_size=512,
                              norm_before_residual=False)
    assert fused_op.op_takes(cfg)
    assert not fused_op.op_takes(dataclasses.replace(cfg, head_dim=96))
