"""Review s65 of targets/corpus.py: what each conversation holds (module names, methods, signatures, the
docstring cut out of the shown source), the boundaries of what is kept, odd source files, the slice share,
and the micro preset's corpus pinned so that a change of conversion must bump FORMAT_VERSION."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from drafter_lab.targets import corpus as c
from drafter_lab.targets.presets import PRESETS

SRC = '''def ann(a: int) -> int:
    """Return a plus one, written for the test corpus of this module."""
    return a + 1


class Box:
    def get(self):
        """Return the content of the box, as it was last put in."""
        return self.v


def only_doc():
    """Only a docstring and no body at all, so nothing to show."""


def multi():
    """First paragraph of a docstring that spans
    several lines of text.

    Second paragraph.
    """
    return 2
'''

# The micro preset's corpus: the tests' pairs, their cache keys and fingerprints are built from it.
MICRO_FILES_HASH = "01dbab13ee013b406856ebb616c5cae2d80ec69df78530b4b1220c56be8eb102"
MICRO_CORPUS_SHA256 = "b7ab71e086a350ec88b5ae7872e06da8c5bd11581bbf206ba614eafaeb42582e"


def _build(files, share=0.35, heldout=0, max_source_chars=1200):
    return c.build_corpus(files, seed=0, shifted_share=share, heldout_per_slice=heldout,
                          max_source_chars=max_source_chars)


def _by_id(corpus) -> dict[str, list[dict]]:
    return {r["id"]: r["conversations"] for r in corpus.base + corpus.shifted}


def test_each_function_becomes_the_conversation_of_its_slice():
    """Eight packages of the same source: each function lands in either slice somewhere."""
    files = [c.SourceFile(f"pkg{k}/__init__.py", SRC.encode()) for k in range(8)]
    convs = _by_id(_build(files))
    names = {i.split(":", 1)[1] for i in convs}
    # a package's __init__ names the package; methods are Class.method; a docstring alone makes nothing
    assert names == {f"pkg{k}.{f}" for k in range(8) for f in ("ann", "Box.get", "multi")}
    seen = set()
    for cid, (ask, answer) in convs.items():
        kind, name = cid.split(":", 1)
        module, fn = name.split(".", 1)
        seen.add((kind, fn))
        assert ask["role"] == "user" and answer["role"] == "assistant"
        if (kind, fn) == ("base", "ann"):
            assert ask["content"] == (f"Write `ann(a: int) -> int` for the `{module}` module.\n\n"
                                      "Return a plus one, written for the test corpus of this module.")
            assert answer["content"] == "```python\n" + SRC.split("\n\n\n")[0] + "\n```"
        if (kind, fn) == ("shifted", "multi"):  # every line of the docstring is cut, its closing quotes too
            assert ask["content"] == f"What does this function from `{module}` do?\n\n```python\ndef multi():\n    return 2\n```"
            assert answer["content"] == ("First paragraph of a docstring that spans\nseveral lines of text.\n\n"
                                         "Second paragraph.")
        if (kind, fn) == ("base", "Box.get"):
            assert ask["content"].startswith(f"Write `Box.get(self)` for the `{module}` module.")
            assert answer["content"].startswith("```python\ndef get(self):\n")
    assert {("base", "ann"), ("shifted", "multi"), ("base", "Box.get")} <= seen


def _documented(name: str, doc: str) -> str:
    return f'def {name}(x):\n    """{doc}"""\n    return x\n'


def test_docstring_and_source_lengths_at_their_limits():
    at, under = "d" * c.MIN_DOC_CHARS, "d" * (c.MIN_DOC_CHARS - 1)
    fits = _documented("fits", "f" * 60)
    text = "\n\n".join([_documented("at_min", at), _documented("under_min", under), fits,
                        _documented("over", "o" * 61)])
    files = [c.SourceFile(f"m{k}.py", text.encode()) for k in range(6)]
    names = {i.split(":", 1)[1].split(".", 1)[1] for i in _by_id(_build(files, max_source_chars=len(fits.rstrip())))}
    # a docstring of MIN_DOC_CHARS and a source of max_source_chars are kept; one character more or less is not
    assert names == {"at_min", "fits"}


def test_the_write_request_summary_keeps_whole_paragraphs_within_its_cap():
    first, second = "a" * 200, "b" * (c.MAX_SUMMARY_CHARS - 202)  # together exactly MAX_SUMMARY_CHARS
    text = "\n\n".join([
        _documented("two", f"{first}\n\n    {second}\n\n    third"),
        _documented("long", "L" * (c.MAX_SUMMARY_CHARS + 100)),  # one paragraph over the cap: cut to it
    ])
    files = [c.SourceFile(f"m{k}.py", text.encode()) for k in range(8)]
    asks = {i.split(".", 1)[1]: conv[0]["content"].split("\n\n", 1)[1]
            for i, conv in _by_id(_build(files, max_source_chars=10_000)).items() if i.startswith("base:")}
    assert asks["two"] == f"{first}\n\n{second}"
    assert asks["long"] == "L" * c.MAX_SUMMARY_CHARS


def test_odd_source_files_are_read_or_skipped_not_a_traceback():
    good = _documented("f", "Return x unchanged, for a corpus test about odd files.")
    files = [
        c.SourceFile("latin1.py", b"# caf\xe9 (latin-1, not UTF-8)\n" + good.encode()),
        c.SourceFile("nul.py", b"x = 1\x00\n" + good.encode()),  # ast.parse: SyntaxError, ValueError before 3.11.x
        c.SourceFile("syntax.py", b"def (:\n"),
        *(c.SourceFile(f"ok{k}.py", good.encode()) for k in range(6)),
    ]
    names = {i.split(":", 1)[1] for i in _by_id(_build(files))}
    assert "latin1.f" in names and not any(n.startswith(("nul.", "syntax.")) for n in names)


def test_a_snapshot_archive_yields_only_its_python_files(tmp_path):
    """An archive not made by write_snapshot (a README, a data file beside the sources)."""
    archive = tmp_path / "lib.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        for name, data in (("a.py", b"x = 1\n"), ("README.txt", b"notes\n"), ("pkg/data.json", b"{}")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert [f.relpath for f in c.source_files(source=archive)] == ["a.py"]


@pytest.mark.parametrize("share", [0.2, 0.35, 0.8])
def test_shifted_share_is_the_share_of_functions_in_the_shifted_slice(share):
    text = "\n\n".join(_documented(f"f{i}", f"Return x, function number {i} of a corpus test.") for i in range(400))
    corpus = _build([c.SourceFile("many.py", text.encode())], share=share)
    assert len(corpus.shifted) / 400 == pytest.approx(share, abs=0.06)


def test_the_seed_orders_each_slice_so_it_picks_the_held_out_part():
    """Not only which slice a function lands in: the functions both seeds put in BASE come in another order."""
    text = "\n\n".join(_documented(f"f{i}", f"Return x, function number {i} of a corpus test.") for i in range(200))
    files = [c.SourceFile("many.py", text.encode())]
    orders = [[r["id"] for r in c.build_corpus(files, seed=seed, shifted_share=0.35, heldout_per_slice=0,
                                                max_source_chars=1200).base] for seed in (0, 1)]
    both = set(orders[0]) & set(orders[1])
    assert len(both) > 50 and [i for i in orders[0] if i in both] != [i for i in orders[1] if i in both]


def test_the_micro_presets_corpus_is_pinned():
    """Its files are spread over the whole snapshot, and their conversion is fixed: a change must bump
    FORMAT_VERSION (which the cache keys hold) and these numbers together."""
    cfg = PRESETS["micro"]
    every = c.source_files()
    picked = c.source_files(cfg.corpus_max_files)
    assert picked[0] == every[0] and every.index(picked[-1]) > 0.95 * len(every)
    assert c.corpus_hash(picked) == MICRO_FILES_HASH
    corpus = c.build_corpus(picked, seed=cfg.seed, shifted_share=cfg.shifted_share,
                            heldout_per_slice=cfg.heldout_per_slice, max_source_chars=cfg.max_source_chars)
    parts = [corpus.base, corpus.shifted, corpus.heldout_base, corpus.heldout_shifted]
    assert (c.FORMAT_VERSION, hashlib.sha256(json.dumps(parts).encode()).hexdigest()) == (1, MICRO_CORPUS_SHA256)
    assert corpus.summary()["conversations"] == {"base": 107, "shifted": 53, "heldout_base": 14,
                                                 "heldout_shifted": 14}


def test_a_source_directory_with_a_dangling_link_is_one_line_naming_it(tmp_path):
    """A `.py` link whose file is gone (a half-removed checkout): the error names it, not an OSError traceback."""
    (tmp_path / "ok.py").write_text("x = 1\n")
    (tmp_path / "gone.py").symlink_to(tmp_path / "nowhere.py")
    with pytest.raises(c.LabError, match=r"gone\.py: cannot read this corpus source: No such file"):
        c.source_files(source=tmp_path)
