"""Review s75 h2: mutation audit of drafter/commands.py: `vocab compare`'s tables (default and zero rows,
one side with no tokens of its own, token text) and the target dtype `export` reads."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from drafter_lab.cli import main
from drafter_lab.data.vocab import DraftVocab
from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import save_drafter
from drafter_lab.targets.hf import load_tokenizer

from .test_model import random_drafter, small_config

GAPS = "largest disagreements by position"
ONLY = "tokens held by one side only"


def _cells(out: str, n: int) -> list[list[str]]:
    """The cells of each rich table row in `out` that has `n` columns."""
    rows = [[c.strip() for c in line.strip().strip("│").split("│")] for line in out.splitlines() if "│" in line]
    return [r for r in rows if len(r) == n]


def _words(out: str) -> str:
    """`out` with its runs of blanks as one space: a title longer than its table wraps."""
    return " ".join(out.split())


def _save(tmp_path, name: str, used, vocab: int = 100):
    DraftVocab.from_used(torch.tensor(used), vocab).save(tmp_path / name)
    return str(tmp_path / name)


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # no wrapped cells


def test_vocab_compare_prints_ten_rows_of_each_table_by_default(tmp_path, capsys):
    a, b = _save(tmp_path, "a", range(0, 30)), _save(tmp_path, "b", range(30, 60))  # 30 gaps, 30 ids each side
    assert main(["vocab", "compare", a, b]) == 0
    out = capsys.readouterr().out
    assert len(_cells(out, 4)) == 10
    assert [r for r in _cells(out, 2) if r[0].isdigit()] == [[str(i), str(30 + i)] for i in range(10)]
    assert f"{ONLY} (lowest 10 ids)" in _words(out)


def test_vocab_compare_of_no_rows_prints_the_summary_alone(tmp_path, capsys):
    a, b = _save(tmp_path, "a", [0, 2, 4]), _save(tmp_path, "b", [1, 2, 9])
    assert main(["vocab", "compare", a, b, "--top", "0"]) == 0
    out = capsys.readouterr().out
    assert "draft vocab comparison" in out and GAPS not in _words(out) and ONLY not in _words(out)
    assert ["tokens only in A", "2"] in _cells(out, 2)


@pytest.mark.parametrize("swap", [False, True])
def test_vocab_compare_lists_the_tokens_of_one_side_when_the_other_has_none_of_its_own(tmp_path, capsys, swap):
    """B's 4..7 all in A's 0..7: only A's column has ids, B's cells stay blank (and the reverse)."""
    a, b = _save(tmp_path, "a", range(8)), _save(tmp_path, "b", range(4, 8))
    assert main(["vocab", "compare", *((b, a) if swap else (a, b))]) == 0
    out = capsys.readouterr().out
    assert ONLY in _words(out)
    want = [["", str(i)] if swap else [str(i), ""] for i in range(4)]
    assert [r for r in _cells(out, 2) if all(c.isdigit() or not c for c in r)] == want  # not the summary's


def test_vocab_compare_shows_each_token_with_its_text_given_a_tokenizer(random_llama, tmp_path, capsys):
    a, b = _save(tmp_path, "a", [0, 2, 4, 6]), _save(tmp_path, "b", [0, 2, 5, 40])
    assert main(["vocab", "compare", a, b, "--tokenizer", str(random_llama)]) == 0
    tok = load_tokenizer(random_llama)

    def show(i):
        return f"{i} {tok.convert_ids_to_tokens(i)!r}"

    assert _cells(capsys.readouterr().out, 4) == [["3", show(6), show(40), "34"], ["2", show(4), show(5), "1"]]


@pytest.fixture
def trained(tmp_path):
    """A float32 drafter whose run.json names a target directory whose config.json is no JSON object."""
    src = tmp_path / "run"
    save_drafter(random_drafter(small_config(), seed=3, dtype=torch.float32), src, formats.SGLANG)
    (tmp_path / "t").mkdir()
    (tmp_path / "t/config.json").write_text("[]")
    (src / "run.json").write_text(json.dumps({"config": {}, "target": {"path": str(tmp_path / "t")}}))
    return src


def _dtypes(out) -> set:
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        return {f.get_slice(k).get_dtype() for k in f.keys() if k not in ("d2t", "t2d")}


def test_with_dtype_given_the_recorded_target_is_not_read(trained, tmp_path, capsys):
    """Only a --target typed beside --dtype is read (to refuse a typo); the run record's is not needed."""
    argv = ["export", "--drafter", str(trained), "--format", "sglang"]
    assert main([*argv, "--out", str(tmp_path / "o"), "--dtype", "float16"]) == 0
    assert _dtypes(tmp_path / "o") == {"F16"}
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "o2")]) == 2  # without --dtype it is read, and refused
    assert capsys.readouterr().err == f"error: {tmp_path / 't/config.json'}: config.json is not a JSON object\n"


@pytest.mark.parametrize("config", [{"architectures": ["LlamaForCausalLM"]}, {"torch_dtype": 16}])
def test_a_target_that_names_no_dtype_keeps_the_drafters_without_a_note(trained, tmp_path, capsys, config):
    (tmp_path / "t/config.json").write_text(json.dumps(config))
    assert main(["export", "--drafter", str(trained), "--format", "sglang", "--out", str(tmp_path / "o")]) == 0
    assert _dtypes(tmp_path / "o") == {"F32"}
    assert capsys.readouterr().err == f"exported {trained} as sglang -> {tmp_path / 'o'}\n"


def test_vocab_build_refuses_an_out_that_is_no_vocabulary_before_opening_the_data(trained, tmp_path, capsys):
    """A drafter's weights file named as --out is refused first, not after the train split is counted."""
    weights = trained / "model.safetensors"
    before = weights.read_bytes()
    argv = ["vocab", "build", "--data", str(tmp_path / "no-data"), "--size", "8", "--out", str(weights)]
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"error: {weights}: exists and is not a draft vocabulary (it holds more than "
                                       "d2t and t2d): give another --out (it is not overwritten)\n")
    assert weights.read_bytes() == before


def test_vocab_compare_heads_each_column_of_its_tables(tmp_path, capsys):
    a, b = _save(tmp_path, "a", [0, 2, 4, 6]), _save(tmp_path, "b", [0, 2, 5, 19])
    assert main(["vocab", "compare", a, b]) == 0
    heads = [[c.strip() for c in line.strip().strip("┃").split("┃")] for line in capsys.readouterr().out.splitlines()
             if "┃" in line]
    assert heads == [["", "value"], ["position", "A target", "B target", "|gap|"], ["only in A", "only in B"]]
