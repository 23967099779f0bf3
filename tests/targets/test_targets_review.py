"""`targets build` inputs that crashed late with a traceback, built a target other than the one asked
for, or deleted the cache: each refused in one line before any training."""

from __future__ import annotations

import pytest

from drafter_lab import cli
from drafter_lab.errors import LabError
from drafter_lab.targets import build as build_mod
from drafter_lab.targets import corpus as corpus_mod


@pytest.fixture
def no_training(monkeypatch):
    def trained(*args, **kwargs):
        raise AssertionError("train_lm ran: the input should have been refused first")

    monkeypatch.setattr(build_mod, "train_lm", trained)


def _build(tmp_path, *flags, out=None):
    out = out or tmp_path / "pair"
    return cli.main(["targets", "build", "--preset", "micro", "--out", str(out),
                     "--cache-dir", str(tmp_path / "cache"), *flags])


@pytest.mark.parametrize("flags,says", [
    # a negative share of each fine-tune batch: torch's "negative dimension" traceback after training base
    (("--tune-shifted-fraction", "1.5"), "--tune-shifted-fraction must be between 0 and 1, got 1.5"),
    (("--tune-shifted-fraction", "nan"), "--tune-shifted-fraction must be between 0 and 1, got nan"),
    (("--shifted-share", "2"), "--shifted-share must be between 0 and 1, got 2.0"),
    # trained on windows longer than the saved config says the model takes
    (("--seq-len", "128", "--max-position-embeddings", "64"), "--seq-len 128 exceeds --max-position-embeddings 64"),
])
def test_settings_refused_before_any_work(tmp_path, capsys, no_training, flags, says):
    assert _build(tmp_path, *flags) == 2
    assert capsys.readouterr().err.strip() == f"error: {says}"
    assert not (tmp_path / "pair").exists()


def test_drift_conversations_shorter_than_a_window(tmp_path, capsys, no_training):
    """No drift window: a reshape traceback from the model, after base was trained and cached."""
    assert _build(tmp_path, "--drift-conversations", "1", "--seq-len", "512") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress log lines
    assert err == ("error: the 1 held-out base conversation(s) for drift hold fewer than seq_len 512 tokens; "
                   "raise drift_conversations")
    assert not list((tmp_path / "cache").glob("base-*"))


def test_vocab_size_the_corpus_cannot_reach(tmp_path, capsys, no_training):
    """The trainer stopped short: the model had a vocabulary of 4586 under a pair.json saying 100000."""
    assert _build(tmp_path, "--vocab-size", "100000") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == "error: vocab_size 100000: this corpus yields only 4586 tokens; lower vocab_size or raise corpus_max_files"


def test_out_below_a_file(tmp_path, capsys, no_training):
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "pair"
    assert _build(tmp_path, out=out) == 2  # was NotADirectoryError reading out/pair.json
    assert capsys.readouterr().err.strip() == f"error: {out}: --out lies below a file, not a directory"


@pytest.mark.parametrize("inside", ["cache", "."])
def test_cache_inside_out_dir_is_refused(tmp_path, no_training, inside):
    """Each build replaces out_dir whole: a cache inside it was deleted, and every build retrained base."""
    out = tmp_path / "pair"
    with pytest.raises(LabError, match="holds the cache dir .* replaces it whole"):
        build_mod.build_pair("micro", out, cache_dir=out / inside)
    assert not out.exists()


def test_corrupt_snapshot_is_one_line(tmp_path):
    data = bytearray(corpus_mod.SNAPSHOT.read_bytes())
    data[100_000:100_050] = b"x" * 50  # past the xz header: lzma.LZMAError while reading members
    bad = tmp_path / "bad.tar.xz"
    bad.write_bytes(bytes(data))
    with pytest.raises(LabError, match="bad.tar.xz: cannot read the corpus snapshot"):
        corpus_mod.source_files(source=bad)
