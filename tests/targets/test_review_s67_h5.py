"""Review s67 (h5) of targets/drift.py, corpus.py and build.py: a CKA of rows without variance is nan
however their values round, and the mutants the earlier tests let live."""

from __future__ import annotations

import copy
import io
import json
import math
import os
import shutil
import stat
import tarfile

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.errors import LabError
from drafter_lab.targets import build as build_mod
from drafter_lab.targets import corpus as corpus_mod
from drafter_lab.targets.drift import CkaMoments, linear_cka, measure_drift
from drafter_lab.targets.fingerprint import fingerprint


def test_rows_without_variance_give_nan_whatever_their_value_rounds_to():
    """Rows of 0.1 left a rounding residue in the centred moments: a CKA of 1 (or 0) where there is none,
    which the probe read as aux layers that stay aligned."""
    x = torch.randn(1000, 4, generator=torch.Generator().manual_seed(0))
    flat = torch.full((1000, 4), 0.1)
    assert math.isnan(linear_cka(flat, flat)) and math.isnan(linear_cka(flat, x)) and math.isnan(linear_cka(x, flat))
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)


def test_variance_is_seen_across_batches_not_only_within_one():
    one, other = torch.full((8, 3), 0.1), torch.full((8, 3), 0.3)
    same = CkaMoments()
    for _ in range(2):
        same.update(one, one)
    assert math.isnan(same.value())
    moved, half = CkaMoments(), CkaMoments()
    for m, y in ((moved, other), (half, one)):
        m.update(torch.zeros(0, 3), torch.zeros(0, 3))  # an empty batch first sets no reference row
        m.update(one[:1], one[:1])  # a batch of one token
        m.update(other, y)  # each batch constant, the two different: variance, on one side or both
    assert moved.value() == pytest.approx(1.0, abs=1e-9) and math.isnan(half.value())


def test_drift_on_one_repeated_token_has_no_embedding_cka():
    """Every position of the input embeds to the same row: index 0 has no variance, so no CKA (it was 1.0)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=53, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    cka = measure_drift(model, copy.deepcopy(model), [torch.full((2, 9), 7)])["cka"]
    assert math.isnan(cka[0])


def _functions(n: int) -> bytes:
    return "".join(f'def f{i}(x):\n    """Return x, function number {i} of this corpus test."""\n    return x\n\n'
                   for i in range(n)).encode()


def test_a_slice_held_out_whole_is_refused_one_conversation_short_of_it_taken():
    """Each slice needs one conversation to train on besides the held-out ones: else base trains on nothing."""
    files = [corpus_mod.SourceFile("many.py", _functions(30))]

    def build(heldout):
        return corpus_mod.build_corpus(files, seed=0, shifted_share=0.35, heldout_per_slice=heldout,
                                       max_source_chars=1200)

    whole = build(0)
    smaller = min(len(whole.base), len(whole.shifted))
    kind = "base" if len(whole.base) == smaller else "shifted"
    assert len(getattr(build(smaller - 1), kind)) == 1
    with pytest.raises(LabError) as e:
        build(smaller)
    assert str(e.value) == (f"corpus too small: the {kind} slice has {smaller} conversations, "
                            f"need more than {smaller} held out (from 1 files)")


def test_a_snapshot_without_python_sources_is_refused_naming_it(tmp_path):
    archive = tmp_path / "lib.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        info = tarfile.TarInfo("README.txt")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"notes\n"))
    with pytest.raises(LabError) as e:
        corpus_mod.source_files(source=archive)
    assert str(e.value) == f"{archive}: the corpus snapshot holds no Python sources"


def test_a_written_snapshot_holds_readable_files_without_times_or_owners(tmp_path):
    """Byte-for-byte the same from any checkout (the source's mode and time do not enter), and, extracted,
    files anyone can read."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "a.py").write_text("x = 1\n")
    (tmp_path / "lib" / "a.py").chmod(0o600)
    assert corpus_mod.write_snapshot(tmp_path / "lib", tmp_path / "lib.tar.xz") == 1
    with tarfile.open(tmp_path / "lib.tar.xz") as tar:
        [member] = tar.getmembers()
    assert (member.name, member.mode, member.mtime, member.uid, member.uname) == ("a.py", 0o644, 0, 0, "")


@pytest.fixture
def stage(random_llama, tmp_path):
    """A cache entry as `_build_base` leaves it, from the shared random Llama: a model and a prompt file."""
    root = tmp_path / "base-0123"
    shutil.copytree(random_llama, root / "model")
    (root / "prompts-eval.jsonl").write_text('{"id": "a"}\n')
    return root


def _perturb_weights(model_dir):
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 1
    save_file(tensors, path, metadata={"format": "pt"})


def test_a_cache_entry_says_which_of_its_parts_changed(stage, monkeypatch):
    logged = []
    monkeypatch.setattr(build_mod, "log", logged.append)
    info = build_mod._record(stage)
    assert set(info["files"]) == {"prompts-eval.jsonl", *(f"model/{f.name}" for f in (stage / "model").iterdir()
                                                          if f.suffix != ".safetensors")}
    check = lambda: build_mod._mismatch(stage, info["files"], {"model": info["fingerprint"]})  # noqa: E731
    assert check() is None
    assert build_mod._cached_stage(stage, "tuned", "b") is None and logged == []  # none yet: nothing to say
    (stage / "build.json").write_text(json.dumps({**info, "base_fingerprint": "b"}))
    assert build_mod._cached_stage(stage, "tuned", "b") is not None
    assert build_mod._cached_stage(stage, "tuned", "c") is None
    assert logged == [f"tuned: cached ({stage})",
                      f"tuned: rebuilding the cache entry {stage}: fine-tuned from another build of base"]
    _perturb_weights(stage / "model")
    assert check() == "the weights in model/ have changed"
    weights = stage / "model" / "model.safetensors"
    os.truncate(weights, 4)  # a full disk: the fingerprint's own error, naming the file
    assert check().startswith(f"{weights}: not a safetensors file")
    (stage / "prompts-eval.jsonl").write_text('{"id": "b"}\n')
    assert check() == "prompts-eval.jsonl has changed"  # the other files are checked first


def test_a_pair_copied_out_is_found_again_only_whole_and_under_its_key(stage, random_llama, tmp_path, monkeypatch):
    logged = []
    monkeypatch.setattr(build_mod, "log", logged.append)
    (stage / "prompts-train.jsonl").write_text('{"id": "t"}\n')
    tuned = tmp_path / "tuned-4567"
    shutil.copytree(random_llama, tuned / "model")
    weights = fingerprint(random_llama)
    out = tmp_path / "pair"
    umask = os.umask(0o027)
    try:
        build_mod._copy_into(out, stage, tuned, {"key": "k", "build_seconds": {"base": 1.5},
                                                 "base": {"fingerprint": weights}, "tuned": {"fingerprint": weights}})
        assert os.umask(0o027) == 0o027  # read to set the modes, and put back
    finally:
        os.umask(umask)
    assert sorted(p.name for p in out.iterdir()) == ["base", "pair.json", "prompts-eval.jsonl", "prompts-train.jsonl",
                                                    "tuned"]
    assert stat.S_IMODE(out.stat().st_mode) == stat.S_IMODE((out / "base").stat().st_mode) == 0o750
    assert stat.S_IMODE((out / "pair.json").stat().st_mode) == 0o640
    pair = build_mod._cached_pair(out, "k")
    assert pair["build_seconds"] == {"base": 1.5} and "tuned/tokenizer.json" in pair["files"]
    assert build_mod._cached_pair(out, "another key") is None
    (out / "tuned" / "tokenizer.json").unlink()
    assert build_mod._cached_pair(out, "k") is None
    assert logged == [f"{out}: tuned/tokenizer.json is missing or unreadable; copying the pair again"]
    (out / "pair.json").write_text(json.dumps({**pair, "files": {}, "build_seconds": 1.5}))  # an older pair.json
    assert build_mod._cached_pair(out, "k") is None and len(logged) == 1
    (out / "pair.json").write_text(json.dumps({"key": "k"}))  # cut to its key: not a pair to return
    assert build_mod._cached_pair(out, "k") is None
