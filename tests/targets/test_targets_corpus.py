"""The stdlib chat corpus: deterministic, two disjoint slices, held-out parts never trained on."""

from __future__ import annotations

import re

import pytest

from drafter_lab.errors import LabError
from drafter_lab.targets import corpus as c


def build(files, seed=0, heldout=5, root=None):
    return c.build_corpus(
        files, seed=seed, shifted_share=0.35, heldout_per_slice=heldout, max_source_chars=1200, root=root
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


def test_file_order_and_selection_are_fixed():
    root = c.stdlib_root()
    all_files = c.source_files()
    rel = [p.relative_to(root).as_posix() for p in all_files]
    assert rel == sorted(rel)
    assert not any(part in c.SKIP_DIRS for r in rel for part in r.split("/")[:-1])
    picked = c.source_files(30)
    assert len(picked) == 30 and set(picked) <= set(all_files)


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
    files = c.source_files(root=tmp_path)
    first = build(files, heldout=1, root=tmp_path)
    assert first.hash == c.corpus_hash(files, tmp_path)
    assert len(first.base) + len(first.shifted) == 12 - 2
    mod.write_text(mod.read_text().replace("plus", "and"))
    assert c.corpus_hash(files, tmp_path) != first.hash


def test_too_small_corpus_is_an_error(tmp_path):
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(LabError, match="corpus too small"):
        build(c.source_files(root=tmp_path), root=tmp_path)
    with pytest.raises(LabError, match="no Python sources"):
        c.source_files(root=tmp_path / "nowhere")
