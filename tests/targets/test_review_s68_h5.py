"""Review s68 (h5) of targets/corpus.py and targets/build.py: a docstring sharing its line with code is cut
without that code, lines are numbered as ast numbers them, the corpus hash is unambiguous, two functions of
one name are refused instead of giving two conversations one id; and the mutants the earlier tests let live
(max_files 1, tabs, even held-out counts, the prompt files, what each stage trains on and how)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from types import SimpleNamespace

import pytest

from drafter_lab.targets import build as build_mod
from drafter_lab.targets import corpus as c
from drafter_lab.targets.presets import PRESETS, TargetConfig

DOC = "Return x unchanged, a function of the review corpus for this test."


def _shown(text: str, modules: int = 8) -> dict[str, str]:
    """{slice: the code shown} of the one function of `text`, copied into `modules` modules so that
    both slices get it somewhere."""
    files = [c.SourceFile(f"m{k}.py", text.encode()) for k in range(modules)]
    corpus = c.build_corpus(files, seed=0, shifted_share=0.5, heldout_per_slice=0, max_source_chars=10_000)
    out = {}
    for r in corpus.base + corpus.shifted:
        ask, answer = (m["content"] for m in r["conversations"])
        code = ask if r["slice"] == "shifted" else answer
        out[r["slice"]] = code.split("```python\n", 1)[1].removesuffix("\n```")
    assert set(out) == {"base", "shifted"}
    return out


@pytest.mark.parametrize("text, bare", [
    # the statements after the docstring were cut with its line: a `def` with no body, the answer's code gone
    (f'def f(x):\n    """{DOC}"""; return x\n', "def f(x):\n    return x"),
    (f'def f(x):\n    """{DOC}\n\n    More."""; y = x; return y  # why\n',
     "def f(x):\n    y = x; return y  # why"),
    # UTF-8 before the cut: ast's columns count bytes, not characters
    (f'def f(x):\n    """Ça, café à: {DOC}"""; return "é"\n', 'def f(x):\n    return "é"'),
    # one line for all (it was left out: "nothing to show"), or a signature's last line for all
    (f'def f(x): """{DOC}"""; return x\n', "def f(x): return x"),
    (f'def f(\n    x,\n): """{DOC}"""; return x\n', "def f(\n    x,\n): return x"),
    # a comment after the docstring goes with it; a line left blank goes too
    (f'def f(x):\n    """{DOC}"""  # noqa: D401\n    return x\n', "def f(x):\n    return x"),
])
def test_a_docstring_sharing_its_line_with_code_is_cut_alone(text, bare):
    shown = _shown(text)
    assert shown["shifted"] == bare
    assert shown["base"] == text.rstrip("\n")  # the code asked for is the source as it is


@pytest.mark.parametrize("before", ["\x0c\n", "# a line separator (\u2028) in a comment\n", "s = 'a\x85b'\n"])
def test_lines_are_numbered_as_ast_numbers_them(before):
    """A form feed on a line of its own (older sources put them between sections), or a character that
    str.splitlines ends a line at in a comment or string: every function after it was shown one line early,
    its docstring in the shifted question that it answers."""
    fn = f'def f(x):\n    """{DOC}"""\n    y = x\n    return y'
    assert _shown(f"{before}\n{fn}\n") == {"base": fn, "shifted": "def f(x):\n    y = x\n    return y"}


def test_tabs_are_shown_as_the_columns_python_reads_them_at():
    text = f'def f(x):\n\t"""{DOC}"""\n\tif x:\n\t\treturn x\n'
    assert _shown(text)["shifted"] == "def f(x):\n        if x:\n                return x"


def test_a_paragraph_one_character_past_the_summary_cap_is_left_out():
    """The cap counts the blank line between paragraphs: 5 + 2 + 4 characters fit in 11, not in 10."""
    text = "a" * 5 + "\n\n" + "b" * 4
    assert c._paragraphs_within(text, 11) == text
    assert c._paragraphs_within(text, 10) == "a" * 5


def _old_hash(files: list[c.SourceFile]) -> str:
    h = hashlib.sha256(f"corpus-format-{c.FORMAT_VERSION}".encode())
    for f in files:
        h.update(f.relpath.encode() + b"\0" + f.data + b"\0")
    return h.hexdigest()


def test_the_corpus_hash_tells_apart_files_whose_bytes_hold_the_separator():
    """One file holding what reads as the end of a file and a second one hashed as those two files."""
    one = [c.SourceFile("a.py", b"x = 1\0b.py\0y = 2")]
    two = [c.SourceFile("a.py", b"x = 1"), c.SourceFile("b.py", b"y = 2")]
    assert c.corpus_hash(one) != c.corpus_hash(two)
    # the escape byte is escaped too, else a NUL and its escape read alike
    assert c.corpus_hash([c.SourceFile("a.py", b"x\1\2")]) != c.corpus_hash([c.SourceFile("a.py", b"x\0")])
    assert c.corpus_hash([c.SourceFile("a\0b.py", b"")]) != c.corpus_hash([c.SourceFile("a", b"b.py\0")])


def test_files_without_a_nul_hash_as_before_so_caches_stay():
    files = [c.SourceFile("a.py", b"x = 1\n"), c.SourceFile("pkg/b.py", "s = 'é'\n".encode())]
    assert c.corpus_hash(files) == _old_hash(files)
    assert c.corpus_hash(files[:1]) != c.corpus_hash(files) != c.corpus_hash(files[::-1])


def _fn(name: str, deco: str = "") -> str:
    return f'    {deco}def {name}(self, x=None):\n        """{DOC}"""\n        return x\n'


def _ids(files: list) -> list[str]:
    """The ids of `files`' conversations, beside six other files' (both slices need one)."""
    others = [c.SourceFile(f"q{k}.py", ("class D:\n" + _fn("w")).encode()) for k in range(6)]
    corpus = c.build_corpus(files + others, seed=0, shifted_share=0.5, heldout_per_slice=0, max_source_chars=10_000)
    return sorted(i for r in corpus.base + corpus.shifted if not (i := r["id"].split(":", 1)[1]).startswith("q"))


def test_two_functions_of_one_name_get_two_ids():
    """A property and its setter, both documented: the same id twice. Read back, the second was dropped as a
    duplicate, after the split had counted it (held out, or trained on beside its namesake held out)."""
    text = "class C:\n" + _fn("v", "@property\n    ") + _fn("v", "@v.setter\n    ")
    assert _ids([c.SourceFile("pkg/m.py", text.encode())]) == ["pkg.m.C.v", "pkg.m.C.v@pkg/m.py:7"]


def test_a_module_and_a_package_of_one_name_get_two_ids():
    text = "class C:\n" + _fn("v")
    files = [c.SourceFile("pkg/m.py", text.encode()), c.SourceFile("pkg/m/__init__.py", text.encode())]
    assert _ids(files) == ["pkg.m.C.v", "pkg.m.C.v@pkg/m/__init__.py:2"]


def test_a_namesake_left_out_is_no_collision():
    """Only conversations need distinct ids: a function cut for its length, or without a body, makes none."""
    kept = "class C:\n" + _fn("v")
    files = [c.SourceFile(f"p{k}/m.py", kept.encode()) for k in range(6)]
    files += [c.SourceFile("p0/m/__init__.py", kept.replace("return x", "return x" + " or x" * 300).encode()),
              c.SourceFile("p1/m/__init__.py", kept.replace("        return x\n", "").encode())]
    corpus = c.build_corpus(files, seed=0, shifted_share=0.5, heldout_per_slice=0, max_source_chars=1000)
    names = sorted(r["id"].split(":", 1)[1] for r in corpus.base + corpus.shifted)
    assert names == [f"p{k}.m.C.v" for k in range(6)]


def test_max_files_one_keeps_one_file(tmp_path):
    for name in ("a.py", "b.py", "c.py"):
        (tmp_path / name).write_text(f"# {name}\n")
    assert [f.relpath for f in c.source_files(1, source=tmp_path)] == ["a.py"]
    assert [f.relpath for f in c.source_files(3, source=tmp_path)] == ["a.py", "b.py", "c.py"]


def test_heldout_split_with_even_counts_uses_the_whole_held_out_part():
    """Halves of even counts: one more for eval (or train) than asked moved drift and train a conversation on,
    past the held-out part, and train came out a prompt short."""
    cfg = TargetConfig(train_prompts=6, eval_prompts=4, drift_conversations=1)
    n = cfg.heldout_per_slice
    corpus = SimpleNamespace(heldout_base=[f"b{i}" for i in range(n)],
                             heldout_shifted=[f"s{i}" for i in range(n)])
    assert build_mod._heldout_split(cfg, corpus) == {
        "eval": ["b0", "s0", "b1", "s1"], "drift_base": ["b2"], "drift_shifted": ["s2"],
        "train": ["b3", "s3", "b4", "s4", "b5", "s5"]}


def test_a_prompt_file_holds_one_sharegpt_row_per_conversation(tmp_path):
    """The rows the data reader takes back, in order; a key of the corpus's own besides is not written."""
    from drafter_lab.data.conversations import read_conversations

    turns = [{"role": "user", "content": "Say é."}, {"role": "assistant", "content": "é"}]
    records = [{"id": f"base:m.f{i}", "slice": "base", "conversations": turns, "extra": i} for i in range(2)]
    build_mod._write_jsonl(tmp_path / "p.jsonl", records)
    rows = (tmp_path / "p.jsonl").read_text().splitlines()
    assert rows[0] == json.dumps({"id": "base:m.f0", "slice": "base", "conversations": turns})
    assert [conv.id for conv in read_conversations(tmp_path / "p.jsonl")[0]] == ["base:m.f0", "base:m.f1"]


def test_each_stage_trains_on_its_slices_with_its_own_schedule(tmp_path, monkeypatch):
    """Base: BASE only, learning rate decayed, the config's seed. Tuned: SHIFTED and BASE in the config's
    shares, no decay (a lower drift is an earlier point of the same fine-tune), another seed. Recorded, not
    trained."""
    slices, calls = {}, []
    real = build_mod.encode_conversations

    def encode(tok, records):
        stream = real(tok, records)
        slices[id(stream)] = {r["slice"] for r in records}
        return stream

    def train(model, sources, **kw):
        calls.append(([(slices[id(s)], share) for s, share in sources], kw))
        return {"steps": kw["steps"], "tokens": 0, "first_loss": None, "final_loss": None, "seconds": 0.0}

    monkeypatch.setattr(build_mod, "encode_conversations", encode)
    monkeypatch.setattr(build_mod, "train_lm", train)
    monkeypatch.setattr(build_mod, "torch_threads", lambda n: contextlib.nullcontext())  # 2 threads on paper
    cfg = dataclasses.replace(PRESETS["micro"], tune_shifted_fraction=0.75, warmup_steps=8, threads=2)
    pair = build_mod.build_pair(cfg, tmp_path / "pair", drift=0.5, cache_dir=tmp_path / "cache")
    same = dict(batch_size=cfg.batch_size, seq_len=cfg.seq_len, weight_decay=cfg.weight_decay)
    assert calls == [
        ([({"base"}, 1.0)], dict(steps=cfg.base_steps, lr=cfg.base_lr, warmup_steps=8, decay=True,
                                 seed=cfg.seed, description="train base", **same)),
        ([({"shifted"}, 0.75), ({"base"}, 0.25)],
         dict(steps=3, lr=cfg.tune_lr, warmup_steps=cfg.tune_steps, decay=False, seed=cfg.seed + 1,
              description="fine-tune tuned (drift 0.5)", **same)),
    ]
    assert (pair["base"]["train"]["steps"], pair["tuned"]["train"]["steps"]) == (cfg.base_steps, 3)
    assert pair["torch_threads"] == 2  # the config's, not the caller's (one, in these tests)
    assert pair["prompts"] == {"train_file": "prompts-train.jsonl", "eval_file": "prompts-eval.jsonl",
                               "train": cfg.train_prompts, "eval": cfg.eval_prompts}
