"""The target's cache after a verify and a commit: accepted entries in place, the rest dead."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from drafter_lab.spec.target import TargetRunner
from drafter_lab.spec.tree import DraftTree, chain


class _Ops(TorchDispatchMode):
    """Names of the aten ops dispatched inside the block."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _prefilled(target, lens: list[int], gen: torch.Generator) -> TargetRunner:
    runner = TargetRunner(target.model, [], target.path)
    ids = torch.randint(target.vocab_size, (len(lens), max(lens)), generator=gen)
    runner.prefill(ids, torch.tensor(lens), aux=False)
    return runner


def _cache(runner: TargetRunner) -> list[torch.Tensor]:
    return [getattr(layer, name).clone() for layer in runner.cache.layers for name in ("keys", "values")]


def test_commit_moves_each_rows_accepted_nodes_to_its_next_slots(target):
    """Rows of different lengths, a tree with branches: after the commit, slot lens[b] + j holds the
    entry verified for path[b, j], the committed prefix is untouched, and the cache ends at the
    longest row."""
    gen = torch.Generator().manual_seed(1)
    runner = _prefilled(target, [9, 5, 7], gen)
    # root, two children of the root, a child of node 2, a child of node 3
    parents = torch.tensor([[-1, 0, 0, 2, 3]]).expand(3, 5)
    depth = torch.tensor([[0, 1, 1, 2, 3]]).expand(3, 5)
    tree = DraftTree(torch.randint(target.vocab_size, (3, 5), generator=gen), parents.clone(), depth.clone())
    runner.verify(tree.tokens, tree.depth, tree.ancestors(), aux=False)
    before, lens, S_old = _cache(runner), runner.lens.clone(), runner.cache.get_seq_length() - tree.size
    path = torch.tensor([[0, 2, 3, 4], [0, 1, -1, -1], [0, 2, 3, -1]])
    counts = torch.tensor([4, 2, 3])
    runner.commit(path, counts, tree.size)

    assert runner.lens.tolist() == [13, 7, 10]
    for old, new in zip(before, _cache(runner)):
        assert new.shape[2] == 13
        for b in range(3):
            n = int(lens[b])
            torch.testing.assert_close(new[b, :, :n], old[b, :, :n], rtol=0, atol=0)
            for j in range(int(counts[b])):
                torch.testing.assert_close(new[b, :, n + j], old[b, :, S_old + path[b, j]], rtol=0, atol=0)


def test_a_chain_at_batch_1_commits_without_touching_the_cache(target):
    """Batch 1: the verified chain already sits in the slots a plain decode would use, so the commit
    only cuts the cache at the accepted length; a second row, shorter, has to move its entries."""
    gen = torch.Generator().manual_seed(2)
    for lens, moves in (([6], False), ([6, 4], True)):
        runner = _prefilled(target, lens, gen)
        tree = chain(torch.randint(target.vocab_size, (len(lens),), generator=gen),
                     torch.randint(target.vocab_size, (len(lens), 4), generator=gen))
        runner.verify(tree.tokens, tree.depth, tree.ancestors(), aux=False)
        before = _cache(runner)
        path = torch.arange(5).expand(len(lens), 5)
        with _Ops() as ops:
            runner.commit(path, torch.full((len(lens),), 3), tree.size)
        assert ("index_put_" in ops.names) == moves, ops.names
        for old, new in zip(before, _cache(runner)):
            assert new.shape[2] == 9
            torch.testing.assert_close(new[0], old[0, :, :9], rtol=0, atol=0)


def _slice_as_transformers_5_17(hidden_states, logits_to_keep):
    """How transformers up to 5.17 sliced before the head: a tensor indexes the positions of every row."""
    keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    return hidden_states[:, keep, :]


def test_prefill_gives_each_row_its_last_token_logits_under_older_transformers(target, monkeypatch):
    """Rows of different lengths: the logits prefill returns are each row's at its last prompt token,
    also where transformers broadcasts a per-row [B, 1] position list (5.17, seen on an H200 image;
    the engine then read [B, B, V] logits and emitted lists as tokens)."""
    import transformers.models.llama.modeling_llama as llama

    gen = torch.Generator().manual_seed(2)
    lens = [9, 4, 6]
    ids = torch.randint(target.vocab_size, (len(lens), max(lens)), generator=gen)
    want = torch.stack([target.model(input_ids=ids[b : b + 1, :n]).logits[0, -1] for b, n in enumerate(lens)])
    for slicing in ("installed", "5.17"):
        if slicing == "5.17":
            # (5.17 itself slices inline, as this does, and has no such function to replace)
            monkeypatch.setattr(llama, "slice_logits_to_keep", _slice_as_transformers_5_17, raising=False)
        runner = TargetRunner(target.model, [], target.path)
        with torch.no_grad():
            got, _ = runner.prefill(ids, torch.tensor(lens), aux=False)
        assert got.shape == want.shape, slicing
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=slicing)
