"""`vocab build`, `vocab compare` and `export` as the CLI prints and refuses them: the numbers in each
table and line, and the target dtype export falls back from."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from drafter_lab.cli import main
from drafter_lab.data.vocab import DraftVocab, count_train_tokens
from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import save_drafter

from .test_model import random_drafter, small_config


def _rows(out: str) -> list[list[str]]:
    """The cells of each row of the rich tables in `out`."""
    return [[c.strip() for c in line.strip().strip("│").split("│")] for line in out.splitlines() if line.count("│") >= 3]


@pytest.fixture
def pair(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # no wrapped cells
    # A (6 of 20): 0 2 4 6 8 10; B (4 of 20): 0 2 5 19. Same positions 0, 1; gaps 1 (position 2), 13 (3).
    DraftVocab.from_used(torch.tensor([0, 2, 4, 6, 8, 10]), 20).save(tmp_path / "a.safetensors")
    DraftVocab.from_used(torch.tensor([0, 2, 5, 19]), 20).save(tmp_path / "b.safetensors")
    return tmp_path / "a.safetensors", tmp_path / "b.safetensors"


def test_vocab_compare_prints_each_count_on_its_own_row(pair, capsys):
    a, b = pair
    assert main(["vocab", "compare", str(a), str(b), "--top", "1"]) == 0
    rows = _rows(capsys.readouterr().out)
    summary = {r[0]: r[1] for r in rows if len(r) == 2}
    assert summary["A"] == f"{a}: 6 of 20" and summary["B"] == f"{b}: 4 of 20"
    assert summary["positions mapping to the same target token"] == "2 / 4"  # of the positions both have
    assert summary["target tokens both hold"] == "2"
    assert (summary["tokens only in A"], summary["tokens only in B"]) == ("4", "2")
    # --top 1: the largest gap only, and the lowest id held by each side only, each under its own side
    assert [r for r in rows if len(r) == 4] == [["3", "6", "19", "13"]]
    assert ["4", "5"] in rows and ["8", ""] not in rows


def test_vocab_compare_refuses_a_negative_row_count(pair, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["vocab", "compare", str(pair[0]), str(pair[1]), "--top", "-1"])
    assert stop.value.code == 2
    assert "expected a number of rows >= 0, got '-1'" in capsys.readouterr().err


def test_vocab_build_refuses_an_out_directory_before_reading_the_data(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("drafter_lab.data.vocab.count_train_tokens", lambda *a: pytest.fail("the train split was counted"))
    (tmp_path / "v").mkdir()
    argv = ["vocab", "build", "--data", str(tmp_path / "no-data"), "--size", "8", "--out", str(tmp_path / "v")]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'v'}: is a directory: --out takes a file to write\n"


def test_vocab_build_reports_the_coverage_of_the_train_tokens(stdlib_features, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    counts = count_train_tokens(stdlib_features)
    size = int((counts > 0).sum()) // 2  # half the tokens seen: the vocab covers part of the loss positions
    assert main(["vocab", "build", "--data", str(stdlib_features), "--size", str(size),
                 "--out", str(tmp_path / "v.safetensors")]) == 0
    covered = int(counts.sort(descending=True, stable=True).values[:size].sum())
    total = int(counts.sum())
    out = " ".join(capsys.readouterr().out.split())
    assert f"{int((counts > 0).sum())} distinct tokens at loss positions" in out
    assert f"the vocab covers {covered}/{total} = {covered / total:.2%} of them" in out
    assert covered < total


@pytest.fixture
def drafter_dir(tmp_path):
    src = tmp_path / "run"
    save_drafter(random_drafter(small_config(), seed=3, dtype=torch.float32), src, formats.SGLANG)
    return src


def _target(path, config) -> str:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def _dtypes(out) -> set:
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        return {f.get_slice(k).get_dtype() for k in f.keys() if k not in ("d2t", "t2d")}


def test_a_target_dtype_export_cannot_write_keeps_the_drafters(drafter_dir, tmp_path):
    """A float64 (or "auto") target names no dtype export writes: the drafter's own stays, as with no target."""
    target = _target(tmp_path / "t", {"architectures": ["LlamaForCausalLM"], "torch_dtype": "float64"})
    assert main(["export", "--drafter", str(drafter_dir), "--format", "sglang", "--out", str(tmp_path / "o"),
                 "--target", target]) == 0
    assert _dtypes(tmp_path / "o") == {"F32"}


def test_a_target_config_that_is_no_object_is_one_line(drafter_dir, tmp_path, capsys):
    target = _target(tmp_path / "t", ["LlamaForCausalLM"])
    assert main(["export", "--drafter", str(drafter_dir), "--format", "sglang", "--out", str(tmp_path / "o"),
                 "--target", target]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 't' / 'config.json'}: config.json is not a JSON object\n"
    assert not (tmp_path / "o").exists()


def test_a_verifier_for_an_sglang_export_is_refused(drafter_dir, tmp_path, capsys):
    assert main(["export", "--drafter", str(drafter_dir), "--format", "sglang", "--out", str(tmp_path / "o"),
                 "--verifier", "org/target"]) == 2
    assert capsys.readouterr().err == "error: --speculative-tokens and --verifier apply to --format speculators\n"
