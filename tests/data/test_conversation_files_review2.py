"""Conversation files in other encodings (UTF-16 with a BOM, as Windows tools write them; UTF-32;
UTF-8 with a BOM) read as their UTF-8 copies, gzip'd or not; and the work made from a gzip'd file
(a capture's manifest, a regeneration's journal) is keyed by the conversations it holds, not by how
they were compressed."""

from __future__ import annotations

import codecs
import gzip
import json

import pytest
from data_helpers import make_conversations, run_cli, write_jsonl

from drafter_lab import atomic
from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.regenerate import regeneration_settings
from drafter_lab.data.regenerate_server import ServerConfig, _settings
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target


def _rows() -> list[dict]:
    rows = make_conversations(4)
    rows[0]["conversations"][-1]["value"] += " héllo ✓ 𝄞"  # beyond ASCII, and beyond the BMP
    return rows


def _read(path):
    convs, skipped = read_conversations(path)
    return [(c.id, c.messages) for c in convs], skipped


ENCODINGS = {
    "utf-16": lambda t: t.encode("utf-16"),  # with a BOM, little-endian here
    "utf-16-be": lambda t: codecs.BOM_UTF16_BE + t.encode("utf-16-be"),
    "utf-16-le, no BOM": lambda t: t.encode("utf-16-le"),
    "utf-32": lambda t: t.encode("utf-32"),
    "utf-8-sig": lambda t: t.encode("utf-8-sig"),
}


@pytest.mark.parametrize("encode", ENCODINGS.values(), ids=ENCODINGS.keys())
@pytest.mark.parametrize("form", ["jsonl", "jsonl after a blank line", "json", "jsonl.gz"])
def test_a_file_in_another_unicode_encoding_reads_as_its_utf8_copy(tmp_path, encode, form):
    rows = _rows()
    expected = _read(write_jsonl(tmp_path / "plain.jsonl", rows))
    text = json.dumps(rows) if form == "json" else "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    blob = encode(("\n" if "blank" in form else "") + text)
    other = tmp_path / f"c.{form.split()[0]}"
    other.write_bytes(gzip.compress(blob) if form.endswith(".gz") else blob)
    assert _read(other) == expected


def test_a_file_that_is_not_the_utf16_it_looks_like_is_named(tmp_path):
    bad = tmp_path / "c.jsonl"
    bad.write_bytes(codecs.BOM_UTF16_LE + '{"conversations": []}'.encode("utf-16-le") + b"\x00\xd8")  # lone surrogate
    with pytest.raises(LabError, match=r"c.jsonl: looks like UTF-16 text, but cannot be decoded as such"):
        read_conversations(bad)


def test_a_capture_of_a_gzip_file_resumes_from_the_same_conversations_compressed_otherwise(random_llama, tmp_path):
    plain = write_jsonl(tmp_path / "c.jsonl", make_conversations(4))
    fast, best = tmp_path / "fast.jsonl.gz", tmp_path / "best.jsonl.gz"
    fast.write_bytes(gzip.compress(plain.read_bytes(), compresslevel=1))
    best.write_bytes(gzip.compress(plain.read_bytes(), compresslevel=9))
    assert fast.read_bytes() != best.read_bytes()
    out = tmp_path / "feat"
    args = ("--target", random_llama, "--out", out, "--max-length", "128", "--shard-size", "2", "--val-fraction", "0")
    assert run_cli("data", "prepare", "--conversations", fast, *args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    for same in (best, plain):
        assert run_cli("data", "prepare", "--conversations", same, *args) == 0
        assert json.loads((out / "manifest.json").read_text())["shards"] == manifest["shards"]
    # A plain file keeps the key it always had: captures made before still resume.
    assert manifest["source"]["sha256"] == atomic.sha256_file(plain)


def test_a_regeneration_journal_of_a_gzip_file_follows_its_conversations_local_or_served(random_llama, tmp_path):
    target = load_target(random_llama)
    plain = write_jsonl(tmp_path / "c.jsonl", make_conversations(2))
    packed = tmp_path / "c.jsonl.gz"
    keys = []
    for level in (1, 9):
        packed.write_bytes(gzip.compress(plain.read_bytes(), compresslevel=level))
        keys.append(regeneration_settings(target, packed, 0.0, 8, 2, 0)["conversations_sha256"])
        keys.append(_settings(ServerConfig(url="http://127.0.0.1:1"), packed)["conversations_sha256"])
    assert keys == [atomic.sha256_file(plain)] * 4
