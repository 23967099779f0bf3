"""`train --vocab` (review s70, h6): a vocab file or drafter directory handed to train(), its size the run's,
refused in one line naming the path where it cannot be read or naming both flags where --draft-vocab-size
disagrees, and a real run's drafter saved with that vocab."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from drafter_lab.cli import main
from drafter_lab.data.vocab import build_vocab, vocab_from_counts
from drafter_lab.targets.hf import load_target

TRAIN = ["train", "--target", "no-target", "--data", "d", "--out", "no-out"]  # train() is replaced: nothing is read


@pytest.fixture
def vocab_file(tmp_path):
    """A 96-token draft vocab of a 512-token target, saved as `vocab build` saves one."""
    path = tmp_path / "vocab.safetensors"
    vocab_from_counts(torch.ones(512), 96).save(path)
    return path


@pytest.mark.parametrize("more", [[], ["--draft-vocab-size", "96"]])
def test_the_vocab_reaches_train_and_sets_the_draft_vocab_size(trained, tmp_path, vocab_file, more):
    """Over a --config file's size: run.json records the N the drafter has, not the one train() ignored."""
    (tmp_path / "t.toml").write_text("draft_vocab_size = 64\n")
    assert main([*TRAIN, "--config", "t.toml", "--vocab", str(vocab_file), *more]) == 0
    [call] = trained
    assert (call["vocab"], call["cfg"].draft_vocab_size) == (str(vocab_file), 96)


def test_without_vocab_train_builds_its_own(trained):
    assert main([*TRAIN, "--draft-vocab-size", "64"]) == 0
    [call] = trained
    assert (call["vocab"], call["cfg"].draft_vocab_size) == (None, 64)


def test_a_draft_vocab_size_other_than_the_vocabs_is_refused_naming_both(trained, cli_error, vocab_file):
    assert cli_error([*TRAIN, "--vocab", str(vocab_file), "--draft-vocab-size", "64"]) == (
        f"error: --vocab {vocab_file} holds 96 draft tokens, --draft-vocab-size asks for 64: give one of the two")
    assert trained == []


@pytest.mark.parametrize("name, problem", [
    ("missing.safetensors", "draft vocabulary file not found"),
    ("junk.safetensors", "truncated or corrupt safetensors"),
    ("empty-dir", "not a drafter checkpoint: config.json is missing"),
])
def test_a_vocab_that_cannot_be_read_is_one_line_naming_it(trained, cli_error, tmp_path, name, problem):
    """Refused before train() reads anything (the features' scan, the target)."""
    path = tmp_path / name
    if name.startswith("junk"):
        path.write_bytes(b"not safetensors")
    elif name == "empty-dir":
        path.mkdir()
    assert cli_error([*TRAIN, "--vocab", str(path)]).startswith(f"error: {path}: {problem}")
    assert trained == []


def test_a_run_saves_the_vocab_it_was_given(tmp_path, peaked_llama, features):
    """A real run on the tiny target, given a vocab file, then a drafter directory (the first run's): each
    drafter's d2t and t2d are the ones passed, not the top tokens of the train split. A drafter moved on with
    its own vocab (--init-from and --vocab the same directory) keeps every lm_head row in place."""
    n, size = 128, load_target(peaked_llama, tokenizer=False).vocab_size
    given = vocab_from_counts(torch.arange(size, dtype=torch.float64), n)  # the highest ids
    assert not torch.equal(given.d2t, build_vocab(features, n).d2t)  # so the data's own would show
    path = tmp_path / "given.safetensors"
    given.save(path)
    run = ["train", "--target", str(peaked_llama), "--data", str(features), "--max-steps", "2", "--ttt-steps", "1",
           "--batch-size", "4", "--warmup-steps", "0", "--threads", "1"]
    first = tmp_path / "first"
    for src, out, more in ((path, first, []), (first, tmp_path / "second", []),
                           (first, tmp_path / "moved", ["--init-from", str(first)])):
        assert main([*run, "--vocab", str(src), "--out", str(out), *more]) == 0
        saved = load_file(out / "model.safetensors")
        assert torch.equal(saved["d2t"], given.d2t) and torch.equal(saved["t2d"].bool(), given.t2d)
        assert json.loads((out / "run.json").read_text())["config"]["draft_vocab_size"] == n
    report = json.loads((tmp_path / "moved" / "transfer.json").read_text())
    assert (report["positions_agree"], report["rows_copied"], report["rows_from_target"]) == (n, n, 0)


@pytest.mark.parametrize("argv, says", [
    (["train", "--data", "d", "--out", "o"], "the following arguments are required: --target"),
    (["train", "--target", "t", "--out", "o"], "one of the arguments --data --conversations is required"),
    (["train", "--target", "t", "--data", "d"], "the following arguments are required: --out"),
    (["watch", "run"], "the following arguments are required: --baseline"),
])
def test_a_required_option_left_out_is_refused_naming_it(trained, capsys, argv, says):
    """Not handed on as None: a traceback in train() (Path(None)) or the watch's reading."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and says in capsys.readouterr().err
    assert trained == []


@pytest.mark.parametrize("file, flag, says", [
    # the file's value refused alone too, first: the flag's later complaint does not take the blame off it
    ("seed = -1\n", ["--min-lr-ratio", "2"], "seed must be in [0, 2**32), got -1"),
    # the file's metric passes alone and fails with the flag's ttt_steps: the flag's values alone pass
    ('keep_best = "loss_4"\n', ["--ttt-steps", "2"], "keep_best: 'loss_4' is not a validation metric"),
])
def test_a_complaint_the_files_value_draws_names_the_file(trained, tmp_path, cli_error, file, flag, says):
    (tmp_path / "t.toml").write_text(file)
    assert cli_error([*TRAIN, "--config", "t.toml", *flag]).startswith(f"error: t.toml: {says}")
    assert trained == []


def test_follow_waits_then_reports_the_first_matched_validation(tmp_path, monkeypatch, capsys):
    """A run not yet logging is waited for (sleeping, not spinning), then each check that matches a new
    validation says so, the first one too."""
    import time

    def write(run_dir, points):
        (run_dir / "metrics.jsonl").write_text("".join(
            json.dumps({"event": "val", "split": "val", "step": s, "cond_acc_0": 0.5}) + "\n" for s in points))

    run, base = tmp_path / "run", tmp_path / "base"
    run.mkdir(), base.mkdir()
    write(base, [100, 200, 300])
    slept = []

    def sleep(seconds):  # the run logs its first validation; then its own watch stops it, ending the follow
        slept.append(seconds)
        if len(slept) == 1:
            write(run, [100])
        else:
            (run / "watch.json").write_text('{"step": 100}')

    monkeypatch.setattr(time, "sleep", sleep)
    assert main(["watch", str(run), "--baseline", str(base), "--follow", "2"]) == 0
    out = capsys.readouterr().out
    assert slept == [2.0, 2.0] and out.count("waiting for") == 1
    assert "step 100: keep training" in out and "the run's own watch stopped it at step 100" in out
