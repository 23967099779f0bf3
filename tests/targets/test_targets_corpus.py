"""The stdlib chat corpus: pinned, deterministic, two disjoint slices, held-out parts never trained on."""

from __future__ import annotations

import re

import pytest

from drafter_lab.errors import LabError
from drafter_lab.targets import corpus as c

# The shipped snapshot's hash: the targets, every cache key and the README's numbers depend on it.
SNAPSHOT_HASH = "b64ae31fa31954170e37da234c647dab0ac2aa58ed11d7f1c7277ae8895f09bb"


def build(files, seed=0, heldout=5):
    return c.build_corpus(
        files, seed=seed, shifted_share=0.35, heldout_per_slice=heldout, max_source_chars=1200
    )


@pytest.fixture(scope="module")
def files():
    return c.source_files(30)


def test_same_inputs_same_corpus_and_seed_changes_it(files):
    a, b = build(files), build(c.source_files(30))
    assert a == b
    assert a.hash == c.corpus_hash(files)
    other = build(files, seed=1)
    assert [r["id"] for r in other.base] != [r["id"] for r in a.base]


def test_snapshot_is_pinned_and_file_order_fixed():
    all_files = c.source_files()
    assert c.corpus_hash(all_files) == SNAPSHOT_HASH
    rel = [f.relpath for f in all_files]
    assert rel == sorted(rel) and len(rel) == len(set(rel))
    assert not any(part in c.SKIP_DIRS for r in rel for part in r.split("/")[:-1])
    picked = c.source_files(30)
    assert len(picked) == 30 and set(picked) <= set(all_files)


def test_snapshot_round_trip_is_repeatable(tmp_path):
    src = tmp_path / "lib"
    for rel in ("b.py", "a/x.py", "a/tests/skipped.py", "__pycache__/y.py", "notes.txt"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(f"# {rel}\n")
    one, two = tmp_path / "one.tar.xz", tmp_path / "two.tar.xz"
    assert c.write_snapshot(src, one) == c.write_snapshot(src, two) == 2
    assert one.read_bytes() == two.read_bytes()
    assert c.source_files(source=one) == c.source_files(source=src)
    assert [f.relpath for f in c.source_files(source=one)] == ["a/x.py", "b.py"]


def test_slices_are_disjoint_and_shaped_like_sharegpt(files):
    corpus = build(files)
    groups = [corpus.base, corpus.shifted, corpus.heldout_base, corpus.heldout_shifted]
    ids = [r["id"] for g in groups for r in g]
    assert len(ids) == len(set(ids))
    names = lambda recs: {r["id"].split(":", 1)[1] for r in recs}  # noqa: E731
    assert not names(corpus.base + corpus.heldout_base) & names(corpus.shifted + corpus.heldout_shifted)
    assert len(corpus.heldout_base) == len(corpus.heldout_shifted) == 5
    for r in corpus.base + corpus.shifted:
        roles = [m["role"] for m in r["conversations"]]
        assert roles == ["user", "assistant"] and all(m["content"] for m in r["conversations"])
    for r in corpus.base:
        assert r["slice"] == "base" and re.match(
            r"```python\n(async )?def ", r["conversations"][1]["content"]
        )
    for r in corpus.shifted:
        ask, answer = (m["content"] for m in r["conversations"])
        assert r["slice"] == "shifted" and re.search(r"```python\n(async )?def ", ask)
        assert answer not in ask  # the docstring was cut out of the shown source


def test_hash_follows_content(tmp_path):
    mod = tmp_path / "mod.py"
    body = '''def f{i}(x):
    """Return x plus {i}, a function written for this test corpus only."""
    return x + {i}
'''
    mod.write_text("".join(body.format(i=i) for i in range(12)))
    files = c.source_files(source=tmp_path)
    first = build(files, heldout=1)
    assert first.hash == c.corpus_hash(files)
    assert len(first.base) + len(first.shifted) == 12 - 2
    mod.write_text(mod.read_text().replace("plus", "and"))
    assert c.corpus_hash(c.source_files(source=tmp_path)) != first.hash


def test_too_small_corpus_is_an_error(tmp_path):
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(LabError, match="corpus too small"):
        build(c.source_files(source=tmp_path))
    with pytest.raises(LabError, match="no Python sources"):
        c.source_files(source=tmp_path / "nowhere")
    (tmp_path / "broken.tar.xz").write_bytes(b"not an archive")
    with pytest.raises(LabError, match="broken.tar.xz.*cannot read the corpus snapshot"):
        c.source_files(source=tmp_path / "broken.tar.xz")
