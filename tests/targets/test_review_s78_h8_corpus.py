"""targets/corpus.py on small hand-written sources: the snapshot archive, the hash, the seeded split,
and what each function turns into (which are kept, their prompts, the source without its docstring)."""

from __future__ import annotations

import ast
import hashlib
import tarfile

import pytest

from drafter_lab.errors import LabError
from drafter_lab.targets import corpus as c

DOC = "Return the thing asked for, in the order it came in."  # over MIN_DOC_CHARS


def _unit(seed, tag, name):
    return int.from_bytes(hashlib.sha256(f"{seed}:{tag}:{name}".encode()).digest()[:8], "big") / 2**64


def _examples(text: str, relpath="pkg/mod.py", max_source_chars=10_000):
    too_long: list[str] = []
    out = list(c._examples_in(c.SourceFile(relpath, text.encode()), max_source_chars, too_long))
    return out, too_long


def test_a_snapshot_holds_the_python_sources_sorted_repeatably_and_reads_back(tmp_path):
    root = tmp_path / "lib"
    (root / "pkg" / "tests").mkdir(parents=True)
    (root / "z.py").write_text("z = 1\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "a.py").write_bytes(b"a = '\xc3\xa9'\n")
    (root / "pkg" / "notes.txt").write_text("not python")
    (root / "pkg" / "tests" / "test_a.py").write_text("skipped = 1\n")
    out = tmp_path / "snap.tar.xz"
    assert c.write_snapshot(root, out) == 3
    first = out.read_bytes()
    with tarfile.open(out, "r:xz") as tar:
        members = tar.getmembers()
        assert [(m.name, m.size, m.mode, m.mtime, m.uid) for m in members] == [
            ("pkg/__init__.py", 0, 0o644, 0, 0), ("pkg/a.py", 9, 0o644, 0, 0), ("z.py", 6, 0o644, 0, 0)]
    assert c.source_files(source=out) == c.source_files(source=root) == [
        c.SourceFile("pkg/__init__.py", b""), c.SourceFile("pkg/a.py", b"a = '\xc3\xa9'\n"),
        c.SourceFile("z.py", b"z = 1\n")]
    c.write_snapshot(root, out)
    assert out.read_bytes() == first


def test_a_snapshot_without_python_sources_or_unreadable_is_one_line_naming_it(tmp_path):
    empty = tmp_path / "empty.tar.xz"
    with tarfile.open(empty, "w:xz") as tar:
        info = tarfile.TarInfo("readme.txt")
        tar.addfile(info)
    with pytest.raises(LabError, match=rf"^{empty}: the corpus snapshot holds no Python sources$"):
        c.source_files(source=empty)
    broken = tmp_path / "broken.tar.xz"
    broken.write_bytes(b"\xfd7zXZ\x00 not really")
    with pytest.raises(LabError, match=rf"^{broken}: cannot read the corpus snapshot: "):
        c.source_files(source=broken)


def test_the_hash_covers_the_format_each_path_and_bytes_each_field_ended():
    files = [c.SourceFile("a.py", b"x\1y"), c.SourceFile("b.py", b"")]
    want = hashlib.sha256(f"corpus-format-{c.FORMAT_VERSION}".encode() + b"a.py\0x\1\1y\0b.py\0\0").hexdigest()
    assert c.corpus_hash(files) == want
    assert c.corpus_hash([c.SourceFile("a.py", b"x\0b.py\0y")]) != c.corpus_hash(
        [c.SourceFile("a.py", b"x"), c.SourceFile("b.py", b"y")])


def test_unit_is_the_first_8_bytes_of_the_sha256_over_2_to_the_64():
    for name in ("m.f", "pkg.Class.method"):
        assert c._unit(7, "slice", name) == _unit(7, "slice", name)
        assert 0 <= c._unit(7, "order", name) < 1


@pytest.mark.parametrize("relpath, module", [
    ("pkg/__init__.py", "pkg"), ("pkg/sub/mod.py", "pkg.sub.mod"), ("mod.py", "mod"), ("pkg/__init__/x.py", "pkg.__init__.x"),
])
def test_a_module_is_named_by_its_path(relpath, module):
    assert c._module_name(relpath) == module


def test_a_signature_is_the_arguments_and_any_return_annotation():
    f, g = ast.parse("def f(a, b: int = 1, *c, d) -> list[int]: pass\ndef g(x): pass\n").body
    assert c._signature(f) == "(a, b: int=1, *c, d) -> list[int]"
    assert c._signature(g) == "(x)"


def test_the_functions_are_those_of_the_module_and_of_its_classes_methods():
    tree = ast.parse(
        "def f(): pass\nasync def g(): pass\nclass K:\n    x = 1\n    def m(self): pass\n"
        "    async def n(self): pass\n    class Inner:\n        def deep(self): pass\n"
        "def outer():\n    def inner(): pass\n")
    assert [q for q, _ in c._functions(tree)] == ["f", "g", "K.m", "K.n", "outer"]


@pytest.mark.parametrize("limit, want", [(6, "aa\n\nbb"), (5, "aa"), (1, "aa"), (10, "aa\n\nbb\n\ncc")])
def test_the_summary_is_the_leading_paragraphs_that_fit(limit, want):
    assert c._paragraphs_within("aa\n\nbb\n\ncc", limit) == want


def test_a_function_is_kept_at_min_doc_chars_with_one_statement_besides_its_docstring():
    at = "d" * c.MIN_DOC_CHARS
    text = (f'def kept():\n    """{at}"""\n    return 1\n\n'
            f'def short_doc():\n    """{at[1:]}"""\n    return 1\n\n'
            f'def doc_only():\n    """{DOC}"""\n\n'
            f'def no_doc():\n    return 1\n')
    out, too_long = _examples(text)
    assert [(e[1], e[2]) for e in out] == [("kept", 1)] and too_long == []


def test_an_example_is_the_module_the_name_line_signature_doc_source_and_bare_source():
    text = (f"import os\r\n\r\nclass K:\r\n\tdef m(self, x) -> int:\r\n\t\t'''{DOC}\r\n\r\n\t\tMore.'''\r\n"
            "\t\treturn x  # tabs\r\n")
    out, _ = _examples(text, relpath="pkg/__init__.py")
    assert out == [("pkg", "K.m", 4, "(self, x) -> int", f"{DOC}\n\nMore.",
                    f"def m(self, x) -> int:\n        '''{DOC}\n\n        More.'''\n        return x  # tabs",
                    "def m(self, x) -> int:\n        return x  # tabs")]


def test_a_source_over_max_source_chars_is_named_as_too_long_and_one_at_it_is_kept():
    text = f'def f():\n    """{DOC}"""\n    return 1\n'
    source = text.rstrip("\n")
    out, too_long = _examples(text, max_source_chars=len(source))
    assert [e[1] for e in out] == ["f"] and too_long == []
    out, too_long = _examples(text, max_source_chars=len(source) - 1)
    assert out == [] and too_long == ["pkg.mod.f"]


def test_a_source_that_does_not_parse_has_no_examples():
    assert _examples("def f(:\n") == ([], [])


@pytest.mark.parametrize("text, bare", [
    # code after the docstring on its line stays, less its ";"; a comment after it goes
    (f'def f(): """{DOC}"""; return 1\n', "def f(): return 1"),
    (f'def f():\n    """{DOC}"""  # why\n    return 1\n', "def f():\n    return 1"),
    (f'def f():\n    """{DOC}\n    two lines"""\n    return 1\n', "def f():\n    return 1"),
    (f'def f():\n    x = "é"; """{DOC}"""\n    return x\n', None),  # not a docstring: no example
    (f'def f(é=1):\n    """{DOC}""" ; y = "é"\n    return y\n', 'def f(é=1):\n    y = "é"\n    return y'),
])
def test_the_bare_source_is_the_function_without_its_docstring(text, bare):
    out, _ = _examples(text)
    assert [e[6] for e in out] == ([] if bare is None else [bare])


def _files(n):
    body = "".join(f'def f{i}():\n    """{DOC}"""\n    return {i}\n\n' for i in range(n))
    return [c.SourceFile("m.py", body.encode())]


def test_the_split_is_by_seeded_hash_and_the_order_too():
    files = _files(12)
    corpus = c.build_corpus(files, seed=3, shifted_share=0.5, heldout_per_slice=1, max_source_chars=10_000)
    names = [f"m.f{i}" for i in range(12)]
    for kind in ("base", "shifted"):
        chosen = [n for n in names if (_unit(3, "slice", n) < 0.5) == (kind == "shifted")]
        ordered = sorted(chosen, key=lambda n: _unit(3, "order", n))
        got = getattr(corpus, f"heldout_{kind}") + getattr(corpus, kind)
        assert [r["id"] for r in got] == [f"{kind}:{n}" for n in ordered]
        assert len(getattr(corpus, f"heldout_{kind}")) == 1 and all(r["slice"] == kind for r in got)
    assert corpus.files == 1 and corpus.hash == c.corpus_hash(files)
    assert c.build_corpus(files, seed=3, shifted_share=0.5, heldout_per_slice=1, max_source_chars=10_000,
                          content_hash="pinned").hash == "pinned"
    assert corpus.summary() == {"source": c.SNAPSHOT.name, "files": 1, "hash": corpus.hash,
                                "format_version": c.FORMAT_VERSION,
                                "conversations": {"base": len(corpus.base), "shifted": len(corpus.shifted),
                                                  "heldout_base": 1, "heldout_shifted": 1}}


def test_the_conversations_of_each_slice():
    text = f'def f(x) -> int:\n    """{DOC}\n\n    More."""\n    return x\n'
    (module, qualname, _, signature, doc, source, bare), = _examples(text, relpath="pkg/m.py")[0]
    assert c._base_conversation(module, qualname, signature, doc, source) == [
        {"role": "user", "content": f"Write `f(x) -> int` for the `pkg.m` module.\n\n{DOC}\n\nMore."},
        {"role": "assistant", "content": f"```python\n{text.rstrip()}\n```"}]
    assert c._shifted_conversation(module, qualname, bare, doc) == [
        {"role": "user", "content": "What does this function from `pkg.m` do?\n\n```python\n"
                                    "def f(x) -> int:\n    return x\n```"},
        {"role": "assistant", "content": f"{DOC}\n\nMore."}]
    long = "\n\n".join(["p" * 300, "q" * 98, "r"])  # the paragraphs that fit in MAX_SUMMARY_CHARS
    assert c._base_conversation("m", "g", "()", long, "src")[0]["content"].endswith("\n\n" + "p" * 300 + "\n\n" + "q" * 98)
    # a first paragraph too long is cut there
    assert c._base_conversation("m", "g", "()", "s" * 500, "src")[0]["content"].endswith("\n\n" + "s" * 400)


def test_a_record_is_its_slices_conversation():
    files = _files(12)
    corpus = c.build_corpus(files, seed=3, shifted_share=0.5, heldout_per_slice=0, max_source_chars=10_000)
    for r in corpus.base:
        i = r["id"].removeprefix("base:m.f")
        assert r["conversations"][0]["content"] == f"Write `f{i}()` for the `m` module.\n\n{DOC}"
    for r in corpus.shifted:
        i = r["id"].removeprefix("shifted:m.f")
        assert r["conversations"][1]["content"] == DOC and f"return {i}\n```" in r["conversations"][0]["content"]


def test_a_namesake_is_named_by_where_it_is():
    text = (f'class K:\n    def p(self):\n        """{DOC}"""\n        return 1\n\n    def p(self):\n'
            f'        """{DOC}"""\n        return 2\n')
    files = [c.SourceFile("m.py", text.encode())] + _files(12)
    corpus = c.build_corpus(files, seed=3, shifted_share=0.5, heldout_per_slice=0, max_source_chars=10_000)
    ids = {r["id"].split(":", 1)[1] for r in corpus.base + corpus.shifted}
    assert {"m.K.p", "m.K.p@m.py:6"} <= ids and len(ids) == 14


def test_each_slice_needs_more_than_its_held_out_part():
    files = _files(12)
    names = [f"m.f{i}" for i in range(12)]
    shifted = sum(_unit(3, "slice", n) < 0.5 for n in names)
    smaller, n = min(("base", 12 - shifted), ("shifted", shifted), key=lambda t: t[1])  # base is checked first
    c.build_corpus(files, seed=3, shifted_share=0.5, heldout_per_slice=n - 1, max_source_chars=10_000)
    with pytest.raises(LabError, match=rf"^corpus too small: the {smaller} slice has {n} conversations, "
                                       rf"need more than {n} held out \(from 1 files\)$"):
        c.build_corpus(files, seed=3, shifted_share=0.5, heldout_per_slice=n, max_source_chars=10_000)
    with pytest.raises(LabError, match=r"^corpus too small: the base slice has 0 conversations, need more than 0 "
                                       r"held out \(from 1 files\); 12 functions longer than max_source_chars=10 "
                                       r"were left out$"):
        c.build_corpus(files, seed=3, shifted_share=0.5, heldout_per_slice=0, max_source_chars=10)
