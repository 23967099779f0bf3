"""Review of the `data` commands' own behaviours: --aux-layer-ids parsing, the sampling-flag refusal in
the plural, `data regenerate`'s refusals before any work and the file its errors name, the torchrun
rank that reports, the device the target loads on, no lock left beside a file given as --out, and the
numbers the summary table shows."""

from __future__ import annotations

import argparse

import pytest
from data_helpers import run_cli

from drafter_lab.data import commands
from drafter_lab.data.shards import Manifest
from drafter_lab.errors import LabError


def test_aux_layer_ids_take_spaces_and_a_trailing_comma_and_name_a_bad_item():
    assert commands.aux_ids_arg("2, 4,5,") == [2, 4, 5]
    with pytest.raises(argparse.ArgumentTypeError, match="got '2,x'"):
        commands.aux_ids_arg("2,x")


def test_two_sampling_flags_without_regenerate_are_refused_in_the_plural(tmp_path, capsys):
    assert run_cli("data", "prepare", "--target", tmp_path / "t", "--conversations", tmp_path / "c.jsonl",
                   "--out", tmp_path / "f", "--temperature", "0.7", "--seed", "5") == 2
    assert capsys.readouterr().err.startswith("error: --temperature and --seed apply with --regenerate (")


def test_an_out_that_is_a_directory_is_refused_before_any_request(conversations_file, tmp_path, capsys, monkeypatch):
    """Else the whole regeneration ran, and writing the finished file into a directory failed at the end."""
    from drafter_lab.data import regenerate_server

    def no_request(*a, **kw):
        raise AssertionError("a request went out")

    monkeypatch.setattr(regenerate_server, "request_json", no_request)
    out = tmp_path / "outdir"
    out.mkdir()
    assert run_cli("data", "regenerate", "--conversations", conversations_file, "--out", out, "--server",
                   "http://127.0.0.1:9", "--model", "m") == 2
    assert capsys.readouterr().err == (f"error: {out}: --out is a directory; give the path of the jsonl file to "
                                       "write\n")
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("raised, named", [(LabError("the answer ran out"), "conversations"),
                                           (LabError("the answer ran out", "/elsewhere/x"), "/elsewhere/x")])
def test_a_local_regenerations_complaint_names_the_conversations_unless_it_names_a_file(
        random_llama, conversations_file, tmp_path, capsys, monkeypatch, raised, named):
    from drafter_lab.data import regenerate

    def refuse(*a, **kw):
        raise raised

    monkeypatch.setattr(regenerate, "regenerate", refuse)
    assert run_cli("data", "regenerate", "--conversations", conversations_file, "--out", tmp_path / "r.jsonl",
                   "--target", random_llama, "--max-new-tokens", "2") == 2
    path = conversations_file if named == "conversations" else named
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {path}: the answer ran out"


@pytest.mark.parametrize("rank", [0, 1])
def test_under_torchrun_rank_0_alone_prints_the_summary(tmp_path, monkeypatch, rank):
    import torch

    from drafter_lab.data import capture

    left, printed = [], []
    monkeypatch.setattr(capture, "prepare_features", lambda *a, **kw: "the manifest")
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: rank)
    monkeypatch.setattr(torch.distributed, "destroy_process_group", lambda: left.append(rank))
    monkeypatch.setattr(commands, "_print_manifest", lambda manifest, out: printed.append(manifest))
    monkeypatch.setenv("RANK", str(rank))
    assert run_cli("data", "prepare", "--target", tmp_path / "t", "--conversations", tmp_path / "c.jsonl",
                   "--out", tmp_path / "f") == 0
    assert left == [rank]  # every rank leaves the group
    assert printed == (["the manifest"] if rank == 0 else [])


@pytest.mark.parametrize("command", [["prepare", "--conversations", "c.jsonl"], ["import-specforge",
                                                                                 "--hidden-states", "h"]])
def test_an_out_that_is_a_file_leaves_no_lock_beside_it(tmp_path, capsys, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("mine")
    assert run_cli("data", *command, "--target", "t", "--out", "f") == 2
    assert capsys.readouterr().err == "error: f: output path exists and is not a directory\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_the_summary_shows_each_splits_counts_in_their_columns_and_what_was_skipped(capsys):
    shard = {"file": "s", "sha256": "x"}
    manifest = Manifest(target={"fingerprint": "fp"}, aux_layer_ids=[2, 4, 5], dtype="float32",
                        shards={"train": [{**shard, "sequences": 3, "tokens": 700, "loss_tokens": 500},
                                          {**shard, "sequences": 4, "tokens": 11, "loss_tokens": 9}],
                                "val": [{**shard, "sequences": 2, "tokens": 60, "loss_tokens": 40}]},
                        skipped={"no assistant turn": 6})
    commands._print_manifest(manifest, "feats")
    out = capsys.readouterr().out
    rows = {cells[0]: cells[1:] for line in out.splitlines()
            if len(cells := [c for c in line.replace("│", " ").split() if c]) == 5 and cells[0] in ("train", "val")}
    assert rows == {"train": ["2", "7", "711", "509"], "val": ["1", "2", "60", "40"]}
    assert "skipped {'no assistant turn': 6}" in out
    assert "features in feats (target fp)" in out


@pytest.mark.parametrize("flags, device", [([], "cpu"), (["--device", "cuda:1"], "cuda:1")])
def test_a_local_regeneration_loads_the_target_on_the_device_given(conversations_file, tmp_path, monkeypatch, capsys,
                                                                   flags, device):
    from drafter_lab.targets import hf

    def load_target(path, device):
        raise LabError(f"loaded on {device}")

    monkeypatch.setattr(hf, "load_target", load_target)
    assert run_cli("data", "regenerate", "--conversations", conversations_file, "--out", tmp_path / "r.jsonl",
                   "--target", tmp_path / "t", *flags) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"error: loaded on {device}"


@pytest.mark.parametrize("text", ["", " , "])
def test_empty_aux_layer_ids_are_refused_as_the_flag_is_read(text):
    """`--aux-layer-ids ""` read as no ids, which passed the early config check and was refused only after
    the target loaded."""
    with pytest.raises(argparse.ArgumentTypeError, match="expected comma-separated integers like 2,4,5"):
        commands.aux_ids_arg(text)
