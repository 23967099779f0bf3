"""init_from: every count of the transfer report, and every re-indexed lm_head row."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file, save_file

from drafter_lab.data.vocab import DraftVocab
from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import export, save_drafter
from drafter_lab.drafter.config import FORMATS
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.drafter.transfer import init_from, token_map
from drafter_lab.errors import LabError
from drafter_lab.targets.corpus import source_files

from .test_model import LLAMA3, random_drafter, small_config

V, N = 101, 37
USED_SRC = list(range(0, 74, 2))  # 37 even tokens 0..72
# 10 shared at the same positions (0..18), 13 new odd tokens, 7 shared but shifted (60..72), 7 new (80..92)
USED_NEW = list(range(0, 20, 2)) + list(range(21, 47, 2)) + list(range(60, 74, 2)) + list(range(80, 94, 2))


def vocab(used) -> DraftVocab:
    return DraftVocab.from_used(torch.tensor(used), V)


def source(tmp_path, fmt: str, **over):
    cfg = small_config(target_vocab_size=V, draft_vocab_size=N, target_hidden_size=48, **over)
    src = random_drafter(cfg, seed=21, dtype=torch.float32)
    v = vocab(USED_SRC)
    src.d2t.copy_(v.d2t)
    src.t2d.copy_(v.t2d)
    save_drafter(src, tmp_path / "src-sglang")
    if fmt == formats.SGLANG:
        return src, tmp_path / "src-sglang"
    export(tmp_path / "src-sglang", fmt, tmp_path / f"src-{fmt}")
    return src, tmp_path / f"src-{fmt}"


def fresh(cfg) -> Eagle3Drafter:
    torch.manual_seed(5)
    return Eagle3Drafter(cfg)


def target_head(width=48) -> SimpleNamespace:
    head = torch.randn(V, width, generator=torch.Generator().manual_seed(7))
    return SimpleNamespace(lm_head_weight=lambda: head)


@pytest.mark.parametrize("fmt", FORMATS)
def test_remap_counts_and_rows(tmp_path, fmt):
    src, path = source(tmp_path, fmt)
    new_vocab = vocab(USED_NEW)
    drafter = fresh(src.config)
    target = target_head()
    report = init_from(drafter, path, target, new_vocab, remap=True)

    assert report.source_format == fmt
    assert report.positions_agree == 10
    assert report.tokens_shared == 17
    assert report.rows_copied == 17
    assert report.rows_from_target == 20
    src_row = {tok: i for i, tok in enumerate(USED_SRC)}
    for i, tok in enumerate(USED_NEW):
        want = src.lm_head.weight[src_row[tok]] if tok in src_row else target.lm_head_weight()[tok]
        assert torch.equal(drafter.lm_head.weight[i], want), (i, tok)
    for name in ("fc.weight", "midlayer.self_attn.k_proj.weight", "midlayer.hidden_norm.weight", "norm.weight"):
        assert torch.equal(dict(drafter.named_parameters())[name], dict(src.named_parameters())[name])
    assert torch.equal(drafter.d2t, new_vocab.d2t) and torch.equal(drafter.t2d, new_vocab.t2d)
    skipped = {row["tensor"] for row in report.skipped}
    assert skipped == {"d2t", "t2d", "embed_tokens.weight"}
    assert all(row["reason"].startswith("source ") for row in report.skipped if row["tensor"] in ("d2t", "t2d"))
    assert all(row["reason"] for row in report.skipped + report.loaded)
    assert set(report.transferred) == {*formats.REQUIRED_TENSORS, formats.HEAD}
    # the embedding is not the source's: the new drafter keeps its own (the target's)
    assert not torch.equal(drafter.embed_tokens.weight, src.embed_tokens.weight)
    console = Console(record=True, width=200)
    console.print(report.table())
    text = console.export_text()
    assert "10 / 37" in text and "17 / 37" in text and "skipped embed_tokens.weight" in text


def test_no_remap_copies_rows_as_they_are(tmp_path):
    src, path = source(tmp_path, formats.SGLANG)
    drafter = fresh(src.config)
    report = init_from(drafter, path, target_head(), vocab(USED_NEW), remap=False)
    assert torch.equal(drafter.lm_head.weight, src.lm_head.weight)
    assert (report.rows_copied, report.rows_from_target, report.positions_agree) == (N, 0, 10)
    assert torch.equal(drafter.d2t, vocab(USED_NEW).d2t)  # the new mapping, with the old rows: the seeds' bug


def test_verifier_head_is_skipped_with_reason(tmp_path):
    from safetensors.torch import load_file, save_file

    src, path = source(tmp_path, formats.SPECULATORS)
    state = load_file(str(path / "model.safetensors"))
    state["verifier_lm_head.weight"] = torch.randn(V, 48)
    save_file(state, str(path / "model.safetensors"))
    report = init_from(fresh(src.config), path, target_head(), vocab(USED_NEW))
    reasons = {row["tensor"]: row["reason"] for row in report.skipped}
    assert "verifier" in reasons["verifier_lm_head.weight"]


def test_shape_mismatch_names_the_tensor(tmp_path):
    src, path = source(tmp_path, formats.SPECULATORS, intermediate_size=64)
    other = dataclasses.replace(src.config, intermediate_size=80)
    with pytest.raises(LabError, match=r"layers\.0\.mlp\.down_proj\.weight|layers\.0\.mlp\.gate_proj\.weight"):
        init_from(fresh(other), path, target_head(), vocab(USED_NEW))
    wider = dataclasses.replace(src.config, target_hidden_size=40)
    with pytest.raises(LabError, match="fc.weight"):
        init_from(fresh(wider), path, target_head(40), vocab(USED_NEW))


def test_no_remap_with_other_vocab_size_is_refused(tmp_path):
    src, path = source(tmp_path, formats.SGLANG)
    smaller = dataclasses.replace(src.config, draft_vocab_size=30)
    with pytest.raises(LabError, match="lm_head.weight"):
        init_from(fresh(smaller), path, target_head(), vocab(USED_NEW[:30]), remap=False)
    # with the remap, a different N is fine: rows are picked by target token
    report = init_from(fresh(smaller), path, target_head(), vocab(USED_NEW[:30]), remap=True)
    assert report.rows_copied + report.rows_from_target == 30


def test_fill_from_target_needs_matching_width(tmp_path):
    cfg = small_config(target_vocab_size=V, draft_vocab_size=N, target_hidden_size=40)  # H=48 != H_t=40
    src = random_drafter(cfg, seed=3, dtype=torch.float32)
    v = vocab(USED_SRC)
    src.d2t.copy_(v.d2t)
    src.t2d.copy_(v.t2d)
    save_drafter(src, tmp_path / "s")
    with pytest.raises(LabError, match=r"H != H_target"):
        init_from(fresh(cfg), tmp_path / "s", target_head(40), vocab(USED_NEW))
    report = init_from(fresh(cfg), tmp_path / "s", target_head(40), vocab(USED_SRC))  # nothing to fill
    assert report.rows_from_target == 0 and report.positions_agree == N


@pytest.mark.parametrize("remap", [True, False])
def test_a_source_sharing_its_targets_head_gives_every_row_from_the_target(tmp_path, remap):
    """A whole-vocabulary source without lm_head, d2t or t2d (as SGLang and vLLM load it): its rows
    are its target's, which is not at hand, so each new row is this target's; the rest transfers."""
    cfg = small_config(target_vocab_size=V, draft_vocab_size=V, target_hidden_size=48)
    src = random_drafter(cfg, seed=22, dtype=torch.float32)
    src.d2t.zero_()
    src.t2d.fill_(True)
    save_drafter(src, tmp_path / "src", head=False)
    weights = tmp_path / "src" / "model.safetensors"
    save_file({k: v for k, v in load_file(weights).items() if k not in ("d2t", "t2d")}, weights)
    drafter = fresh(dataclasses.replace(cfg, draft_vocab_size=N))
    target = target_head()
    report = init_from(drafter, tmp_path / "src", target, vocab(USED_NEW), remap=remap)
    assert torch.equal(drafter.lm_head.weight, target.lm_head_weight()[USED_NEW])
    assert (report.rows_copied, report.rows_from_target, report.tokens_shared, report.positions_agree) == (0, N, N, 1)
    assert "lm_head.weight" not in report.transferred and "fc.weight" in report.transferred
    reasons = {r["tensor"]: r["reason"] for r in report.skipped}
    assert "shares its target's head" in reasons["lm_head.weight"]
    # the report says the file had no vocab tensors, not that it had some and they were set aside
    assert reasons["d2t"].startswith("not in the source file (read as the identity)")
    assert reasons["t2d"].startswith("not in the source file (derived from its d2t)")
    assert torch.equal(drafter.midlayer.mlp.down_proj.weight, src.midlayer.mlp.down_proj.weight)


@pytest.mark.parametrize("fmt, over, refusal", [
    # speculators' default residual
    (formats.SPECULATORS, {"norm_before_residual": True},
     r"source drafter has norm_before_residual=true, this one false: .*--drafter-norm-before-residual true"),
    # a SpecForge Llama-3.1 drafter learned its attention with llama3-scaled RoPE
    (formats.SGLANG, {"rope_scaling": LLAMA3},
     r"source drafter's RoPE scaling is \{.*llama3.*\}, this one's none: .*--drafter-rope-scaling '\{.*\}'"),
])
def test_a_source_with_another_residual_or_rope_is_refused(tmp_path, fmt, over, refusal):
    src, path = source(tmp_path, fmt, **over)
    plain = {k: type(v)() if isinstance(v, bool) else None for k, v in over.items()}
    with pytest.raises(LabError, match=refusal):
        init_from(fresh(dataclasses.replace(src.config, **plain)), path, target_head(), vocab(USED_NEW))
    report = init_from(drafter := fresh(src.config), path, target_head(), vocab(USED_NEW))
    assert report.rows_copied == 17 and drafter.config == src.config
    assert drafter.midlayer.norm_before_residual == src.config.norm_before_residual


@pytest.mark.parametrize("remap", [True, False])
def test_an_embedding_the_drafter_owns_comes_from_the_source(tmp_path, remap):
    """H != H_target: the drafter trains its own embedding, so it starts from the source's, whose
    rows are target token ids either way; one made for another target vocabulary is skipped."""
    cfg = small_config(target_vocab_size=V, draft_vocab_size=N)  # H 48, H_target 40
    src = random_drafter(cfg, seed=23, dtype=torch.float32)
    src.d2t.copy_(vocab(USED_SRC).d2t)
    src.t2d.copy_(vocab(USED_SRC).t2d)
    save_drafter(src, tmp_path / "src")
    drafter = fresh(cfg)
    report = init_from(drafter, tmp_path / "src", target_head(40), vocab(USED_SRC), remap=remap)
    assert torch.equal(drafter.embed_tokens.weight, src.embed_tokens.weight)
    assert "embed_tokens.weight" in report.transferred  # trained at the transfer's rate, anchored by L2-SP
    assert "embed_tokens.weight" not in {row["tensor"] for row in report.skipped}

    other = random_drafter(dataclasses.replace(cfg, target_vocab_size=V + 10), seed=23, dtype=torch.float32)
    wider = DraftVocab.from_used(torch.tensor(USED_SRC), V + 10)
    other.d2t.copy_(wider.d2t)
    other.t2d.copy_(wider.t2d)
    save_drafter(other, tmp_path / "other")
    drafter = fresh(cfg)
    before = drafter.embed_tokens.weight.clone()
    report = init_from(drafter, tmp_path / "other", target_head(40), vocab(USED_SRC), remap=remap)
    reasons = {row["tensor"]: row["reason"] for row in report.skipped}
    assert reasons["embed_tokens.weight"] == "shape (111, 48), this drafter's own embedding is (101, 48): it starts fresh"
    assert torch.equal(drafter.embed_tokens.weight, before) and "fc.weight" in report.transferred


def test_an_embedding_the_drafter_owns_that_the_source_lacks_is_reported(tmp_path):
    """H != H_target and the source file has no embed_tokens.weight (as EAGLE releases ship): the
    drafter's own embedding stays at its init, and the report says so instead of nothing."""
    cfg = small_config(target_vocab_size=V, draft_vocab_size=N)  # H 48, H_target 40
    src = random_drafter(cfg, seed=23, dtype=torch.float32)
    src.d2t.copy_(vocab(USED_SRC).d2t)
    src.t2d.copy_(vocab(USED_SRC).t2d)
    save_drafter(src, tmp_path / "src", embed=False)
    drafter = fresh(cfg)
    before = drafter.embed_tokens.weight.clone()
    report = init_from(drafter, tmp_path / "src", target_head(40), vocab(USED_SRC))
    reasons = {row["tensor"]: row["reason"] for row in report.skipped}
    assert reasons["embed_tokens.weight"] == "absent from the source file: this drafter's own embedding starts fresh"
    assert torch.equal(drafter.embed_tokens.weight, before) and "fc.weight" in report.transferred
    # a drafter of the target's width embeds with the target's: nothing to report
    cfg = dataclasses.replace(cfg, target_hidden_size=48)
    save_drafter(random_drafter(cfg, seed=23, dtype=torch.float32), tmp_path / "same", embed=False)
    report = init_from(fresh(cfg), tmp_path / "same", target_head(), vocab(USED_SRC))
    assert "embed_tokens.weight" not in {row["tensor"] for row in report.skipped}


def test_a_source_with_another_rope_theta_or_context_length_is_reported(tmp_path):
    """A new target version may change RoPE theta or max_position_embeddings: the transfer goes on, and
    the report (printed, and kept in transfer.json) says the attention weights were trained otherwise."""
    src, path = source(tmp_path, formats.SGLANG, rope_theta=500000.0, max_position_embeddings=2048)
    assert init_from(fresh(src.config), path, target_head(), vocab(USED_NEW)).notes == []
    new = dataclasses.replace(src.config, rope_theta=1e6, max_position_embeddings=8192)
    report = init_from(fresh(new), path, target_head(), vocab(USED_NEW))
    assert report.notes == [
        "rope_theta 500000 -> 1000000: attention weights were trained under another RoPE",
        "max_position_embeddings 2048 -> 8192: the source was configured for another context length",
    ]
    assert "midlayer.self_attn.q_proj.weight" in report.transferred and report.to_json()["notes"] == report.notes


def test_a_token_map_translates_ids_through_both_vocabularies(random_llama):
    """Byte-level BPEs trained on different text (the standard library's, eight files of the pinned corpus): a token
    string both have maps to its id in the source's; one the source lacks, and the padding rows past the
    tokenizer, to -1. Equal vocabularies: None."""
    from drafter_lab.targets.hf import load_tokenizer
    from drafter_lab.targets.tokenizer import train_bpe

    src = load_tokenizer(random_llama)
    new = train_bpe([f.data.decode() for f in source_files(max_files=8)], 400)
    tokens = token_map(src, new, 410)
    theirs, mine = src.get_vocab(), new.get_vocab()
    assert len(tokens) == 410 and (tokens[len(mine):] == -1).all()
    for token, i in mine.items():
        assert tokens[i] == theirs.get(token, -1), token
    moved = sum(theirs.get(t, i) != i for t, i in mine.items())
    assert 0 < moved and (tokens == -1).sum() > 10  # ids that moved, and tokens only the new one has
    assert token_map(src, load_tokenizer(random_llama), 410) is None


@pytest.mark.parametrize("own_embedding", [False, True])
def test_a_remap_by_token_takes_each_row_from_the_source_row_of_the_same_token(tmp_path, own_embedding):
    """The new target's id t is the source target's id tokens[t] (a tokenizer that moved ids): each draft
    token's lm_head row (and the owned embedding's row) comes from the source's row for that token, one
    the source's vocabulary lacks from the target (a fresh embedding row)."""
    over = {"hidden_size": 40} if own_embedding else {}  # H != H_target: the drafter owns its embedding
    src, path = source(tmp_path, formats.SGLANG, **over)
    tokens = torch.arange(V).roll(3)  # new id t is source id t - 3 ...
    tokens[[21, 60]] = -1  # ... and two new tokens the source's vocabulary lacks
    drafter = fresh(src.config)
    before = drafter.embed_tokens.weight.detach().clone()
    target = target_head(width=40 if own_embedding else 48)
    report = init_from(drafter, path, target, vocab(USED_NEW), tokens=tokens, tokens_from="--source-target")
    src_row = {tok: i for i, tok in enumerate(USED_SRC)}
    copied = 0
    for i, tok in enumerate(USED_NEW):
        row = src_row.get(int(tokens[tok]), -1) if tokens[tok] >= 0 else -1
        want = src.lm_head.weight[row] if row >= 0 else target.lm_head_weight()[tok]
        copied += row >= 0
        assert torch.equal(drafter.lm_head.weight[i], want), (i, tok)
    assert (report.remap_by, report.rows_copied, report.rows_from_target) == ("token", copied, N - copied)
    assert report.notes == [f"the two targets' tokenizers differ (found through --source-target): remapped by token "
                            f"string (of the {N} draft tokens, {N - 2} under another id there, 2 absent from it)"]
    if own_embedding:
        has = tokens >= 0
        assert torch.equal(drafter.embed_tokens.weight[has], src.embed_tokens.weight[tokens[has]])
        assert torch.equal(drafter.embed_tokens.weight[~has], before[~has])


def test_the_source_targets_tokenizer_is_found_where_its_run_names_it(random_llama, tmp_path):
    """train --init-from finds the source's target through its run.json (the path, if it still holds the
    weights the fingerprint names), or --source-target; none at hand, the remap goes by id."""
    import json
    import shutil

    from drafter_lab.drafter.transfer import source_tokens
    from drafter_lab.targets.fingerprint import fingerprint
    from drafter_lab.targets.hf import load_target_head
    from drafter_lab.targets.tokenizer import train_bpe

    _, path = source(tmp_path, formats.SGLANG)
    new = tmp_path / "next-version"  # the same weights, a tokenizer trained on other text
    shutil.copytree(random_llama, new)
    train_bpe([f.data.decode() for f in source_files(max_files=8)], 400).save_pretrained(new)
    target = load_target_head(new)
    assert source_tokens(path, None, target) == (None, None)  # no run.json
    run = {"target": {"path": str(random_llama), "fingerprint": fingerprint(random_llama)}}
    (path / "run.json").write_text(json.dumps(run))
    tokens, found = source_tokens(path, None, target)
    assert found == f"the target its run.json names, {random_llama}" and (tokens >= 0).sum() > 100
    assert source_tokens(path, random_llama, target)[1] == "--source-target"
    assert source_tokens(path, None, load_target_head(random_llama)) == (None, found)  # the same tokenizer
    (path / "run.json").write_text(json.dumps({"target": {**run["target"], "fingerprint": "0123456789abcdef"}}))
    assert source_tokens(path, None, target) == (None, None)  # that directory now holds other weights


def test_a_source_target_with_other_weights_than_the_run_records_is_refused(random_llama, wide_llama, tmp_path):
    """--source-target is checked against the fingerprint the source's run.json records: another model's
    tokenizer would remap by the wrong vocabulary. A tokenizer alone (no weights) cannot be checked."""
    import json

    from drafter_lab.drafter.transfer import source_tokens
    from drafter_lab.targets.fingerprint import fingerprint
    from drafter_lab.targets.hf import load_target_head, load_tokenizer

    _, path = source(tmp_path, formats.SGLANG)
    (path / "run.json").write_text(json.dumps({"target": {"path": str(random_llama),
                                                          "fingerprint": fingerprint(random_llama)}}))
    target = load_target_head(random_llama)
    with pytest.raises(LabError) as e:
        source_tokens(path, wide_llama, target)
    assert str(e.value) == (f"{path}: --source-target {wide_llama} is not the target this drafter was trained on: "
                            f"its run.json records {fingerprint(random_llama)}, that directory is "
                            f"{fingerprint(wide_llama)} (pass the drafter's own target, or leave --source-target out)")
    tokenizer_only = tmp_path / "tokenizer-only"
    load_tokenizer(random_llama).save_pretrained(tokenizer_only)
    assert source_tokens(path, tokenizer_only, target) == (None, "--source-target")
    assert source_tokens(path, random_llama, target) == (None, "--source-target")


def test_a_token_map_across_tokenizer_families_pairs_tokens_of_the_same_bytes():
    """A sentencepiece-style vocabulary ('▁' for a space, <0xNN> byte fallback) against a byte-level BPE
    ('Ġ' for a space, one character per byte): tokens pair by the bytes they stand for, so the new 'é'
    (c3 a9) is the source's 'Ã©', never its one-byte 'é' (e9); <0xE9> is that byte; special tokens pair
    by content."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from drafter_lab.targets.tokenizer import train_bpe

    texts = ["Le café est très réputé à côté de l'hôtel. Élève, déjà, été, où, naïve, façade. " * 3,
             "日本語のテキストです。中文文本。Ñandú, über, Größe, straße. " * 3] * 50
    texts += [f.data.decode() for f in source_files(max_files=8)]
    src = train_bpe(texts, 600)
    sp = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    sp.normalizer = normalizers.Replace(" ", "▁")
    sp.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    sp.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    specials = ["<unk>", "<s>", "</s>", "<|endoftext|>"] + [f"<0x{i:02X}>" for i in range(256)]
    sp.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=600, special_tokens=specials, show_progress=False))
    new = PreTrainedTokenizerFast(tokenizer_object=sp, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tokens = token_map(src, new, len(new) + 8)
    theirs, mine = src.get_vocab(), new.get_vocab()
    assert (tokens[len(new):] == -1).all() and (tokens >= 0).sum() > 400
    assert tokens[mine["é"]] == theirs["Ã©"] and tokens[mine["<0xE9>"]] == theirs["é"]
    assert tokens[mine["▁de"]] == theirs["Ġde"] and tokens[mine["<|endoftext|>"]] == theirs["<|endoftext|>"]
    whole = 0  # a pair of tokens each whole UTF-8 on its own decodes to the same text
    for i in (tokens >= 0).nonzero().flatten().tolist():
        a = new.convert_tokens_to_string([new.convert_ids_to_tokens(i)])
        b = src.convert_tokens_to_string([src.convert_ids_to_tokens(int(tokens[i]))])
        if "\ufffd" not in a + b:
            whole += 1
            assert a == b, (i, a, b)
    assert whole > 300


def test_a_run_record_whose_target_path_is_not_a_string_is_one_line(tmp_path):
    import json

    from drafter_lab.drafter.transfer import source_tokens

    _, path = source(tmp_path, formats.SGLANG)
    (path / "run.json").write_text(json.dumps({"target": {"path": 5, "fingerprint": "abc"}}))
    with pytest.raises(LabError) as e:
        source_tokens(path, None, None)
    assert str(e.value) == f"{path / 'run.json'}: run record's target.path is 5, not a string"
