"""A resume's draft vocab on a target smaller than the default size, and train-step bookkeeping (review s72, h4)."""

from __future__ import annotations

import pytest

from drafter_lab.cli import main
from drafter_lab.data.vocab import build_vocab
from drafter_lab.train import state

FLAGS = ["--batch-size", "4", "--max-steps", "1", "--ttt-steps", "1", "--warmup-steps", "0", "--threads", "1"]


@pytest.fixture(scope="module")
def vocab_run(peaked_llama, features, tmp_path_factory):
    """A finished CLI run begun with --vocab (a 100-token file) on the 512-token target."""
    root = tmp_path_factory.mktemp("vocab_run")
    vocab = root / "vocab.safetensors"
    build_vocab(features, 100).save(vocab)
    out = root / "run"
    common = ["train", "--target", str(peaked_llama), "--data", str(features), "--out", str(out), *FLAGS]
    assert main([*common, "--vocab", str(vocab)]) == 0
    return out, common


def test_a_resume_without_its_vocab_on_a_small_target_says_how_to_give_it(vocab_run, capsys):
    """Without --vocab the size is the default 1024, more than the target's 512 tokens: the resume was refused
    as a bad --draft-vocab-size ("must be in 1..512, got 1024") that was never typed, with no word of the
    vocab the run began with (on a larger target the vocab's own check names it)."""
    out, common = vocab_run
    kept = state.state_path(out).read_bytes()
    capsys.readouterr()
    assert main([*common, "--resume"]) == 2
    err = " ".join(capsys.readouterr().err.split())  # one line, however the console wraps it
    assert f"{out}: --resume with another draft vocab (d2t has 100 draft ids there" in err
    assert "draft_vocab_size 1024 now is more than the target's 512 tokens" in err
    assert "--vocab with the run's directory reads it" in err
    assert state.state_path(out).read_bytes() == kept

    # the cure it names: the run's own directory as --vocab resumes (the finished run, returned)
    assert main([*common, "--resume", "--vocab", str(out)]) == 0


def test_a_train_line_counts_every_loss_position_of_its_step_however_it_is_cut(peaked_llama, features, tmp_path):
    """One step over the whole train split: at TTT step 0 each loss token past a sequence's first two is one
    position (no prompt token is a loss token), and the step's line is the same cut into 1 or 3 micro-batches
    (but for rounding). Nothing pinned a train line's counts: a step's counts left out of it, doubled or
    rounded down per micro-batch went unseen."""
    from drafter_lab.data.vocab import count_train_tokens
    from drafter_lab.train.config import TrainConfig
    from drafter_lab.train.loop import train
    from drafter_lab.train.metrics_log import read_metrics

    lines = []
    for accumulation in (1, 3):
        cfg = TrainConfig(draft_vocab_size=128, batch_size=1000, max_steps=1, ttt_steps=2, warmup_steps=0,
                          log_every=1, accumulation_steps=accumulation, threads=1)
        out = tmp_path / f"run{accumulation}"
        train(cfg, peaked_llama, features, out)
        (line,) = [r for r in read_metrics(out) if r["event"] == "train"]
        del line["elapsed_s"]
        lines.append(line)
    assert lines[0]["positions"] == int(count_train_tokens(features).sum()) > 0
    rounded = [{k for k, v in line.items() if isinstance(v, float)} for line in lines]
    assert {k: v for k, v in lines[1].items() if k not in rounded[1]} == {k: v for k, v in lines[0].items()
                                                                          if k not in rounded[0]}
    assert {k: lines[1][k] for k in rounded[1]} == pytest.approx({k: lines[0][k] for k in rounded[0]}, rel=1e-4)
