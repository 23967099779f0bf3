"""N-gram drafting: the incremental index against the scanning definition, padded chains that are
never accepted, lossless decoding, and `eval --ngram` feeding the cost model."""

from __future__ import annotations

import json
import random

import pytest
import torch

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.spec.accept import greedy_walk, sampled_walk
from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.spec.eval import evaluate, pool
from drafter_lab.spec.ngram import NgramDrafter, continuations_reference, trie
from drafter_lab.spec.ngram_config import NgramConfig
from drafter_lab.spec.tree import padded_tree
from drafter_lab.targets.hf import load_target

from .test_engine import hf_greedy


def _propose(drafter: NgramDrafter, tokens: list[int], steps: int) -> list[int]:
    """The chain a row drafts (k = 1)."""
    found = drafter.continuations(drafter.rows[0], tokens, steps, 1)
    return found[0] if found else []


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("across", [False, True], ids=["own-row", "across-prompts"])
@pytest.mark.parametrize("sizes", [(1, 1), (1, 3), (2, 4), (3, 3)])
def test_index_matches_the_scanning_definition(sizes, across, k):
    """Rows grown by random chunks over a small alphabet (many repeats), checked after every chunk;
    across prompts, each row also looks up the rows finished before it."""
    cfg = NgramConfig(*sizes, across_prompts=across)
    rng = random.Random(hash((sizes, across, k)))
    drafter, earlier, proposed, several = NgramDrafter(cfg), [], 0, 0
    for _ in range(40):
        tokens = [rng.randrange(5) for _ in range(rng.randrange(1, 6))]
        drafter.reset(1)
        while len(tokens) < 60:
            steps = rng.randrange(1, 6)
            got = drafter.continuations(drafter.rows[0], tokens, steps, k)
            assert got == continuations_reference(tokens, steps, k, cfg, earlier), (tokens, steps)
            proposed += bool(got)
            several += len(got) > 1
            tokens += [rng.randrange(5) for _ in range(rng.randrange(1, 5))]
        drafter.finish([tokens])
        earlier += [tokens] if across else []
    assert proposed > 100 and (several > 10 if k > 1 else several == 0)


def test_longest_then_most_recent_match():
    def propose(tokens, steps, lo, hi):
        d = NgramDrafter(NgramConfig(lo, hi))
        d.reset(1)
        return _propose(d, tokens, steps)

    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3]
    # [1, 2, 3] occurred at 0 and at 4: the most recent one is continued
    assert propose(tokens, 2, 1, 3) == [7, 1]
    # the longest suffix wins: [8, 5] matches only as a 1-gram, [3, 8, 5] as a 3-gram
    tokens = [8, 5, 6, 6, 3, 8, 5, 4, 0, 8, 5, 1, 3, 8, 5]
    assert propose(tokens, 3, 1, 3) == [4, 0, 8]
    assert propose(tokens, 3, 1, 1) == [1, 3, 8]
    # a continuation stops at the row's end; no earlier occurrence, or a suffix under min_n: nothing
    assert propose([5, 6, 5], 4, 1, 2) == [6, 5]
    assert propose([5, 6, 5], 4, 2, 4) == []
    assert propose([1, 2, 3], 4, 1, 4) == []
    with pytest.raises(LabError, match="min_n <= max_n"):
        NgramConfig(3, 2)


def test_across_prompts_looks_up_earlier_rows_after_its_own():
    d = NgramDrafter(NgramConfig(2, 3, across_prompts=True))
    d.finish([[7, 1, 2, 3, 4], [1, 2, 5, 6]])  # two rows finished before
    d.reset(1)
    assert _propose(d, [9, 1, 2], 4) == [5, 6]  # the most recent earlier row, cut at its end
    assert _propose(d, [9, 1, 2, 8, 1, 2], 4) == [8, 1, 2]  # the row's own occurrence comes first
    assert _propose(d, [0, 7, 1, 2], 2) == [3, 4]  # a longer match in an older row wins
    d.forget()
    d.reset(1)
    assert _propose(d, [9, 1, 2], 4) == []
    own_only = NgramDrafter(NgramConfig(2, 3))
    own_only.finish([[7, 1, 2, 3, 4]])
    own_only.reset(1)
    assert _propose(own_only, [9, 1, 2], 4) == []


def test_trie_merges_continuations_within_the_budget():
    assert trie([[1, 2, 3], [1, 2, 4], [5]], 10) == [(1, 0), (2, 1), (3, 2), (4, 2), (5, 0)]
    assert trie([[1, 2, 3], [1, 2, 4], [5]], 4) == [(1, 0), (2, 1), (3, 2), (4, 2)]
    assert trie([[1, 2, 3], [6, 7]], 4) == [(1, 0), (2, 1), (3, 2), (6, 0)]
    tree = padded_tree(torch.tensor([9, 8]), [trie([[1, 2, 3], [1, 2, 4], [5]], 10), []], pad_id=0)
    assert tree.parents[0].tolist() == [-1, 0, 1, 2, 2, 0] and tree.depth[0].tolist() == [0, 1, 2, 3, 3, 1]
    assert tree.parents[1].tolist() == [-1, 1, 2, 3, 4, 5] and tree.drafted().tolist() == [5, 0]


def test_padding_nodes_are_verified_but_never_accepted():
    root = torch.tensor([10, 11, 12])
    tree = padded_tree(root, [trie([[4, 5]], 9), [], trie([[6]], 9)], pad_id=0)
    assert tree.tokens.tolist() == [[10, 4, 5], [11, 0, 0], [12, 6, 0]]
    anc = tree.ancestors()
    assert anc[1, 1].tolist() == [False, True, False] and anc[2, 2].tolist() == [False, False, True]
    # The target wants every draft, then the pad token: rows 1 and 2 must not accept their padding.
    want = torch.tensor([[4, 5, 7], [0, 0, 0], [6, 0, 0]])
    logits = torch.nn.functional.one_hot(want, 16).float()
    path, counts, bonus = greedy_walk(tree, logits)
    assert counts.tolist() == [3, 1, 2] and bonus.tolist() == [7, 0, 0]
    path_s, counts_s, bonus_s = sampled_walk(tree, logits, torch.Generator().manual_seed(0))
    assert counts_s.tolist() == [3, 1, 2] and bonus_s.tolist() == [7, 0, 0] and torch.equal(path_s, path)
    assert padded_tree(root, [[], [], []], pad_id=0).size == 1


@pytest.mark.parametrize("across", [False, True], ids=["own-row", "across-prompts"])
def test_ngram_decoding_is_lossless(target, prompts, across):
    engine = SpecEngine(target, NgramDrafter(NgramConfig(1, 3, across_prompts=across)),
                        SpecConfig(steps=4, max_new_tokens=40, stop_at_eos=False))
    spec = engine.generate(prompts[:1])
    assert spec.tokens[0] == hf_greedy(target, prompts[0], 40)
    base = engine.generate(prompts, speculative=False)
    spec = engine.generate(prompts)  # rows propose different lengths: padded chains
    assert spec.tokens == base.tokens
    assert max(spec.accept_lengths) > 1 and min(spec.accept_lengths) == 1
    assert spec.verify_passes < base.verify_passes and spec.phase_seconds["draft"] > 0
    # a step with nothing drafted emits one token; none emits more than it drafted, plus the bonus
    pairs = list(zip(spec.accept_lengths, spec.draft_lengths))
    assert len(pairs) == len(spec.draft_lengths) and all(a <= d + 1 for a, d in pairs)
    assert 0 < sum(d == 0 for _, d in pairs) < len(pairs)


def test_ngram_continuous_batching_looks_up_rows_as_they_leave(target, prompts):
    """Across prompts with two rows in flight: a row that has left is looked up by the rows after it."""
    drafter = NgramDrafter(NgramConfig(1, 3, across_prompts=True))
    engine = SpecEngine(target, drafter, SpecConfig(steps=4, max_new_tokens=24, stop_at_eos=False))
    base = engine.generate(prompts, speculative=False)
    drafter.forget()
    spec = engine.generate(prompts, slots=2)
    assert spec.tokens == base.tokens and max(spec.rows_per_pass) == 2
    assert len(drafter.earlier.row_ends) == len(prompts)  # every row, as it left
    drafter.forget()
    own = SpecEngine(target, NgramDrafter(NgramConfig(1, 3)), engine.cfg).generate(prompts, slots=2)
    assert sum(spec.accept_lengths) / len(spec.accept_lengths) > sum(own.accept_lengths) / len(own.accept_lengths)


@pytest.mark.gpu
def test_ngram_decoding_on_cuda_equals_the_cpu(random_llama, target, prompts):
    """Padded chains built on the device, verified there: the same tokens and steps as on the CPU."""
    cfg = SpecConfig(steps=4, max_new_tokens=32, stop_at_eos=False)
    cpu = SpecEngine(target, NgramDrafter(NgramConfig(1, 3)), cfg).generate(prompts)
    cuda = SpecEngine(load_target(random_llama, device="cuda"), NgramDrafter(NgramConfig(1, 3)), cfg)
    assert cuda.generate(prompts, speculative=False).tokens == cuda.generate(prompts).tokens
    # fp32 on both; a near-tie may flip a greedy token, so compare the accept lengths loosely
    got = cuda.generate(prompts)
    assert abs(sum(got.accept_lengths) - sum(cpu.accept_lengths)) <= 0.1 * sum(cpu.accept_lengths)


def test_ngram_trees_are_lossless_and_draft_more(target, prompts):
    """top-3 continuations merged into trees of up to 8 nodes, across prompts, three rows a batch."""
    cfg = NgramConfig(1, 3, across_prompts=True)
    out = {}
    for topk, tokens in ((1, None), (3, 8)):
        engine = SpecEngine(target, NgramDrafter(cfg), SpecConfig(steps=4, topk=topk, draft_tokens=tokens,
                                                                  max_new_tokens=32, stop_at_eos=False))
        out[topk] = [engine.generate(prompts[i: i + 3]) for i in (0, 3)]
        base = [engine.generate(prompts[i: i + 3], speculative=False).tokens for i in (0, 3)]
        assert [g.tokens for g in out[topk]] == base
    chain, tree = ([d for g in out[k] for d in g.draft_lengths] for k in (1, 3))
    assert max(chain) <= 4 and max(tree) == 8 and sum(tree) > sum(chain)


class _OneRowDrafts(NgramDrafter):
    """Row 1 drafts the target's own greedy tokens (`script`, then token 0 once it is done, drafts the
    engine must ignore); row 0 never drafts."""

    def __init__(self, script: list[int]):
        super().__init__()
        self.script = script

    def continuations(self, index, tokens, steps, k):
        if len(self.rows) < 2 or index is not self.rows[1]:
            return []
        return [self.script[len(tokens): len(tokens) + steps] or [0]]


def test_a_pass_decodes_plainly_only_when_no_row_drafted(target, prompts):
    """While row 1 is unfinished every pass verifies its draft, though row 0 has none; row 1 accepts
    its drafts and finishes early, and row 0's passes after that are plain decodes."""
    n, plain = 16, SpecEngine(target, None, SpecConfig(max_new_tokens=16, stop_at_eos=False))
    script = prompts[1] + plain.generate(prompts[1:2], speculative=False).tokens[0]
    engine = SpecEngine(target, _OneRowDrafts(script), SpecConfig(steps=2, max_new_tokens=n, stop_at_eos=False))
    alone = engine.generate(prompts[:1])
    assert alone.no_draft_passes == alone.verify_passes == n - 1
    pair = engine.generate(prompts[:2])
    row1_passes = len(pair.accept_lengths) - (n - 1)  # row 0 emits one token a pass after its root
    assert pair.verify_passes == n - 1 and 0 < row1_passes < (n - 1) / 2
    assert pair.no_draft_passes == (n - 1) - row1_passes


def test_evaluate_ngram(target, conversations):
    r = evaluate(target, NgramDrafter(NgramConfig(1, 3)), conversations, steps=3, batch=2, max_new_tokens=32)
    assert r["lossless_check"] == "identical" and r["config"]["drafter"] == "n-gram lookup (1..3)"
    assert r["served_accept_len"] > 1 and sorted(r["accept_histogram"]) == ["1", "2", "3", "4"]
    assert 0 < r["no_draft_share"] < 1
    # the cost model charges 3 lookups on each pass that drafted, (1 - z) of them: that is all the time measured
    drafted = r["verify_passes"] * (1 - r["no_draft_share"])
    assert drafted * 3 * r["draft_step_us"] == pytest.approx(1e6 * r["draft_seconds"])


def test_evaluate_across_prompts_looks_up_the_measured_rows_only(target, conversations):
    """The warm-up decodes the first batch too: its rows must not be there to look up."""
    drafter = NgramDrafter(NgramConfig(1, 3, across_prompts=True))
    r = evaluate(target, drafter, conversations[:4], steps=3, batch=2, max_new_tokens=24)
    assert r["lossless_check"] == "identical" and r["config"]["drafter"] == "n-gram lookup (1..3, across prompts)"
    assert len(drafter.earlier.row_ends) == 4  # the 4 measured rows, not the 2 warm-up rows


def test_cli_eval_ngram_feeds_the_cost_model(random_llama, prompts_file, tmp_path, capsys):
    out = tmp_path / "ngram.json"
    assert main(["eval", "--ngram", "--ngram-min", "1", "--target", str(random_llama), "--prompts", str(prompts_file),
                 "--steps", "3", "--max-new-tokens", "24", "--json", str(out)]) == 0
    assert "n-gram lookup (1..4)" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["drafter"] == "ngram" and data["lossless_check"] == "identical"
    model = tmp_path / "cm.json"
    assert main(["costmodel", "--inputs", str(out), "--json", str(model)]) == 0
    r = json.loads(model.read_text())
    # n-gram drafting's measured host time and no-match share replace the preset's drafter
    assert r["config"]["draft_step_us"] == pytest.approx(data["draft_step_us"])
    assert r["config"]["no_draft_share"] == pytest.approx(data["no_draft_share"]) and data["no_draft_share"] > 0
    assert r["steps_table"][-1]["accept"] == pytest.approx(data["served_accept_len"])


@pytest.mark.parametrize("argv, message", [
    (["--ngram", "--fused", "on"], "--fused applies to an EAGLE-3 drafter"),
    (["--ngram", "--ngram-min", "3", "--ngram-max", "2"], "--ngram-min <= --ngram-max, got --ngram-min=3"),
    (["--drafter", "d", "--ngram-min", "3"], "--ngram-min, --ngram-max and --ngram-across-prompts apply to n-gram"),
    (["--drafter", "d", "--ngram-across-prompts"], "--ngram-across-prompts apply to n-gram drafting"),
    (["--server", "http://127.0.0.1:9", "--ngram-max", "3"], "--ngram-max applies to the lab's own decoding"),
])
def test_cli_ngram_bad_flags(random_llama, prompts_file, capsys, argv, message):
    rc = main(["eval", *argv, "--target", str(random_llama), "--prompts", str(prompts_file)])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1


def test_pooled_ngram_sets_keep_host_time_and_no_match_share(target, conversations):
    sets = {name: evaluate(target, NgramDrafter(NgramConfig(1, 3)), convs, steps=3, max_new_tokens=24)
            for name, convs in (("a", conversations[:3]), ("b", conversations[3:]))}
    p = pool(sets)
    a, b = sets["a"], sets["b"]
    assert p["no_draft_share"] == pytest.approx(
        (a["no_draft_share"] * a["verify_passes"] + b["no_draft_share"] * b["verify_passes"]) / p["verify_passes"])
    assert p["draft_step_us"] * 3 * p["verify_passes"] * (1 - p["no_draft_share"]) == pytest.approx(
        1e6 * (a["draft_seconds"] + b["draft_seconds"]))
