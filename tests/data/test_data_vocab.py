"""Draft vocabulary: top-N by assistant-token frequency, the d2t/t2d invariant, and `vocab compare`."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest
import torch
from data_helpers import run_cli
from safetensors.torch import save_file

from drafter_lab.data.shards import FeatureSet
from drafter_lab.data.vocab import DraftVocab, build_vocab, compare_vocabs, vocab_from_counts
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.formats import sglang_config
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.errors import LabError


def assert_invariant(v: DraftVocab, size: int, target_vocab: int) -> None:
    assert v.d2t.dtype == torch.int64 and v.t2d.dtype == torch.bool
    assert v.size == size and v.target_vocab_size == target_vocab
    assert torch.equal(torch.nonzero(v.t2d).flatten(), v.d2t + torch.arange(size))


def test_build_takes_the_most_frequent_assistant_tokens(features):
    fs = FeatureSet(features)
    counts = Counter()
    for s in fs.sequences("train"):  # train only, loss-masked positions only
        counts.update(s.input_ids[s.loss_mask].tolist())
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    n = len(ranked) // 2
    v = build_vocab(features, n)
    assert_invariant(v, n, fs.manifest.target["vocab_size"])
    assert v.used.tolist() == sorted(ranked[:n])


def test_padding_with_unused_low_ids_when_few_tokens_occur():
    counts = torch.zeros(50, dtype=torch.int64)
    counts[[7, 3, 40]] = torch.tensor([5, 9, 1])
    v = vocab_from_counts(counts, 6)
    assert_invariant(v, 6, 50)
    assert v.used.tolist() == [0, 1, 2, 3, 7, 40]
    tie = vocab_from_counts(torch.tensor([0, 2, 2, 1, 2]), 2)  # ties go to the lower id
    assert tie.used.tolist() == [1, 2]
    with pytest.raises(LabError, match="must be in 1..50"):
        vocab_from_counts(counts, 51)


def test_cli_build_saves_a_loadable_vocab(features, tmp_path, capsys):
    distinct = len({t for s in FeatureSet(features).sequences("train") for t in s.input_ids[s.loss_mask].tolist()})
    out = tmp_path / ("a-directory-name-long-enough-to-pass-eighty-columns-" * 2) / "vocab.safetensors"
    assert run_cli("vocab", "build", "--data", features, "--size", distinct + 20, "--out", out) == 0
    printed = capsys.readouterr().out
    assert "covers" in printed and f" -> {out}\n" in printed  # the path whole, on the line that names it
    v = DraftVocab.load(out)
    assert_invariant(v, distinct + 20, FeatureSet(features).manifest.target["vocab_size"])
    assert torch.equal(v.d2t, build_vocab(features, distinct + 20).d2t)
    assert run_cli("vocab", "build", "--data", features, "--size", distinct, "--out", out) == 0  # rebuilt in place
    assert DraftVocab.load(out).size == distinct


def test_cli_build_does_not_overwrite_other_files(features, tmp_path, capsys):
    """--out pointed at a feature set's manifest.json overwrote it, wrecking the feature set."""
    data = tmp_path / "features"
    shutil.copytree(features, data)
    manifest = (data / "manifest.json").read_bytes()
    assert run_cli("vocab", "build", "--data", data, "--size", 8, "--out", data / "manifest.json") == 2
    assert capsys.readouterr().err.strip() == (f"error: {data / 'manifest.json'}: exists and is not a draft "
                                                "vocabulary (it holds more than d2t and t2d): give another --out "
                                                "(it is not overwritten)")
    assert (data / "manifest.json").read_bytes() == manifest


def constructed_pair(tmp_path):
    a = DraftVocab.from_used(torch.tensor([0, 2, 4, 6, 8, 10]), 20)
    b = DraftVocab.from_used(torch.tensor([0, 2, 5, 6, 15, 19]), 20)
    a.save(tmp_path / "a.safetensors")
    # b as an EAGLE release ships a drafter: pytorch_model.bin, d2t beside the weights and no t2d
    cfg = DrafterConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                        draft_vocab_size=6, target_vocab_size=20, target_hidden_size=8)
    state = {k: v for k, v in Eagle3Drafter(cfg).state_dict().items() if k not in ("t2d", "embed_tokens.weight")}
    (tmp_path / "drafter").mkdir()
    torch.save({**state, "d2t": b.d2t}, tmp_path / "drafter/pytorch_model.bin")
    (tmp_path / "drafter/config.json").write_text(json.dumps(sglang_config(cfg, torch.float32)))
    return a, b


def test_compare_gives_exact_counts(tmp_path, capsys):
    a, b = constructed_pair(tmp_path)
    r = compare_vocabs(a, b, top=2)
    assert r["same_positions"] == 3  # positions 0, 1, 3 -> tokens 0, 2, 6
    assert r["shared_tokens"] == 3 and r["only_a_count"] == 3 and r["only_b_count"] == 3
    assert r["size_a"] == r["size_b"] == 6 and r["target_vocab_a"] == 20
    assert r["largest_gaps"] == [
        {"position": 5, "target_a": 10, "target_b": 19, "gap": 9},
        {"position": 4, "target_a": 8, "target_b": 15, "gap": 7},
    ]
    assert r["only_a"] == [4, 8] and r["only_b"] == [5, 15]
    assert run_cli("vocab", "compare", tmp_path / "a.safetensors", tmp_path / "drafter") == 0
    out = capsys.readouterr().out
    assert "3 / 6" in out and "target tokens both hold" in out


def test_compare_sizes_differ():
    a = DraftVocab.from_used(torch.arange(0, 8), 32)
    b = DraftVocab.from_used(torch.arange(4, 8), 32)
    r = compare_vocabs(a, b)
    assert r["same_positions"] == 0 and r["shared_tokens"] == 4 and r["only_a_count"] == 4 and r["only_b_count"] == 0


def test_compare_by_token_translates_the_first_vocabs_ids():
    """b's target id t is a's t - 1 (a tokenizer that moved ids); a's 10 has no token in b, and b's 3 and
    15 are both a's 2 (the lower id stands for it). a [0 2 4 6 8 10] reads as b's [1 3 5 7 9 -]."""
    a = DraftVocab.from_used(torch.tensor([0, 2, 4, 6, 8, 10]), 20)
    b = DraftVocab.from_used(torch.tensor([1, 3, 5, 7, 12, 19]), 20)
    b_to_a = torch.arange(20) - 1
    b_to_a[11], b_to_a[15], b_to_a[16] = -1, 2, 25  # 25: past a's target vocab, so no token of it
    r = compare_vocabs(a, b, b_to_a=b_to_a)
    assert r["same_positions"] == 4 and r["shared_tokens"] == 4  # positions 0..3; 10 never matches
    assert (r["only_a_count"], r["only_a"]) == (2, [8, 10])  # a's own ids: 10 has none in b
    assert (r["only_b_count"], r["only_b"]) == (2, [12, 19])
    assert r["largest_gaps"] == [{"position": 4, "target_a": 9, "target_b": 12, "gap": 3}]  # 10: no gap to measure
    assert compare_vocabs(a, b)["same_positions"] == compare_vocabs(a, b)["shared_tokens"] == 0  # by id


def test_bad_vocab_files(tmp_path, capsys):
    a, _ = constructed_pair(tmp_path)
    good = (tmp_path / "a.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(good[: len(good) - 7])
    save_file({"d2t": a.d2t}, str(tmp_path / "no_t2d.safetensors"))
    save_file({"d2t": a.d2t + 1, "t2d": a.t2d}, str(tmp_path / "mismatch.safetensors"))
    save_file({"d2t": a.d2t, "t2d": -a.t2d.long()}, str(tmp_path / "negative.safetensors"))  # -1 read as true
    cases = {
        "negative.safetensors": "t2d must be a 1-D bool mask",
        "cut.safetensors": "truncated or corrupt safetensors",
        "no_t2d.safetensors": "no t2d tensor",
        "mismatch.safetensors": "d2t and t2d disagree",
        "missing.safetensors": "draft vocabulary file not found",
    }
    for name, message in cases.items():
        with pytest.raises(LabError, match=message):
            DraftVocab.load(tmp_path / name)
    assert run_cli("vocab", "compare", tmp_path / "a.safetensors", tmp_path / "mismatch.safetensors") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path / 'mismatch.safetensors'}: d2t and t2d disagree: t2d marks {a.size} target tokens; of the {a.size} that d2t maps to, {a.size} are not marked"]


def test_build_refuses_a_partial_capture(features, tmp_path, capsys):
    """A killed `data prepare` lists fewer train shards than it planned: a vocab from part of them is
    refused, in the line training gives."""
    out = tmp_path / "feat"
    shutil.copytree(features, out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"]["train"].pop()
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(LabError, match="partial capture: train has") as refused:
        FeatureSet(out).require("train")  # as training opens it
    vocab = tmp_path / "v.safetensors"
    assert run_cli("vocab", "build", "--data", out, "--size", "32", "--out", vocab) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {refused.value}"]
    assert not vocab.exists()
