"""Resume checks of train.loop (review s71, h3): a run begun with `train --vocab` and resumed without it
is told how to give the vocab, not only that its draft_vocab_size differs."""

from __future__ import annotations

import math
import re
import types

import pytest
import torch

from drafter_lab.cli import main
from drafter_lab.data.vocab import vocab_from_counts
from drafter_lab.errors import LabError
from drafter_lab.train import state
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import _Run, train

RUN = ["--max-steps", "1", "--ttt-steps", "1", "--batch-size", "4", "--warmup-steps", "0", "--threads", "1"]


@pytest.fixture(scope="module")
def vocab_run(peaked_llama, features, tmp_path_factory):
    """A run begun with a 96-token --vocab file (the highest ids, so no size of the data's own matches it)."""
    root = tmp_path_factory.mktemp("s71h3")
    path = root / "vocab.safetensors"
    vocab_from_counts(torch.arange(512, dtype=torch.float64), 96).save(path)
    out = root / "run"
    argv = ["train", "--target", str(peaked_llama), "--data", str(features), "--out", str(out), *RUN]
    assert main([*argv, "--vocab", str(path)]) == 0
    return argv, out, path


def test_a_resume_without_the_runs_vocab_says_to_give_it(vocab_run, capsys):
    """Its config's draft_vocab_size (the default, or a --config file's) differed from the vocab's, and that
    refusal ("a different config (draft_vocab_size)") came first, without the --vocab hint."""
    argv, out, _ = vocab_run
    kept = state.state_path(out).read_bytes()
    capsys.readouterr()
    assert main([*argv, "--draft-vocab-size", "128", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # a progress line may come first
    assert err == (f"error: {out}: --resume with another draft vocab (d2t has 96 draft ids there, 128 now): its "
                   "lm_head rows were trained for the one it began with; give that vocab (--vocab with the run's "
                   "directory reads it), or begin the run again")
    assert state.state_path(out).read_bytes() == kept
    # and the hint works: the run's own directory gives its vocab back
    assert main([*argv, "--vocab", str(out), "--resume"]) == 0


def test_a_size_the_given_vocab_overrode_still_counts_as_another_config(vocab_run, peaked_llama, features):
    """train() called directly keeps the config's draft_vocab_size beside a vocab of another size: a resume that
    changes it alone is still another config once the vocab itself is the run's."""
    _, out, path = vocab_run
    cfg = TrainConfig(draft_vocab_size=64, max_steps=1, ttt_steps=1, batch_size=4, warmup_steps=0, threads=1)
    with pytest.raises(LabError, match=re.escape(f"{out}: --resume with a different config (draft_vocab_size)")):
        train(cfg, peaked_llama, features, out, resume=True, vocab=path)


def test_a_changed_setting_is_named_before_the_drafter_it_builds(vocab_run, peaked_llama, features):
    """The config is compared first: the setting given is named, not the drafter shape it leads to."""
    _, out, path = vocab_run
    cfg = TrainConfig(draft_vocab_size=96, drafter_intermediate_size=96, max_steps=1, ttt_steps=1, batch_size=4,
                      warmup_steps=0, threads=1)
    with pytest.raises(LabError, match=re.escape(f"{out}: --resume with a different config (drafter_intermediate_size)")):
        train(cfg, peaked_llama, features, out, resume=True, vocab=path)


def test_the_first_diverged_step_is_named_whatever_the_losses(tmp_path):
    """Two ranks' first non-finite steps: the earlier one is named, though the later has the lower loss."""
    run = object.__new__(_Run)
    table = torch.tensor([[4, math.inf, math.nan], [5, 2.0, math.inf]], dtype=torch.float64)  # rank 0 went first
    run.d = types.SimpleNamespace(world=2, rank=0, device=torch.device("cpu"), sum=lambda seen: table)
    run.nonfinite, run.kept_step, run.out_dir = table[0], 3, tmp_path
    run.cfg = types.SimpleNamespace(grad_clip=1.0)
    with pytest.raises(LabError, match=re.escape("loss is inf at step 4: the run diverged (lower --lr); the last "
                                                 "checkpoint, step 3, is kept")):
        run.check_finite()


def test_a_state_saved_before_elapsed_s_was_kept_restarts_the_clock(peaked_llama, features, tmp_path, monkeypatch):
    """Such a state resumes with its clock at 0 s, not 1 s: every reading of the clock below is a multiple of
    100 s, and so is each elapsed_s the resume logs."""
    from drafter_lab.train import loop
    from drafter_lab.train.metrics_log import read_metrics

    cfg = TrainConfig(draft_vocab_size=64, max_steps=3, ttt_steps=1, batch_size=4, warmup_steps=0, threads=1,
                      checkpoint_every=1, log_every=1, eval_every=0)
    step = loop._Run.train_step

    def killed_in_step_2(self, *a):  # after step 1's checkpoint
        if self.step == 1:
            raise KeyboardInterrupt
        step(self, *a)

    with monkeypatch.context() as m:
        m.setattr(loop._Run, "train_step", killed_in_step_2)
        with pytest.raises(KeyboardInterrupt):
            train(cfg, peaked_llama, features, tmp_path / "run")
    saved = state.load(tmp_path / "run")
    assert saved["step"] == 1
    del saved["elapsed_s"]
    state.save(tmp_path / "run", saved)
    clock = iter(range(0, 10**6, 100))
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(time=lambda: float(next(clock))))
    train(cfg, peaked_llama, features, tmp_path / "run", resume=True)
    resumed = [r["elapsed_s"] for r in read_metrics(tmp_path / "run") if r["step"] > 1]
    assert resumed and all(t % 100 == 0 for t in resumed), resumed


def test_an_out_below_directories_not_made_yet_is_made(peaked_llama, features, tmp_path):
    out = tmp_path / "runs" / "a" / "run"
    train(TrainConfig(draft_vocab_size=64, max_steps=1, ttt_steps=1, batch_size=4, threads=1), peaked_llama, features,
          out)
    assert (out / "run.json").is_file()


def test_a_grad_clip_of_1_clips(peaked_llama, features, tmp_path):
    """grad_clip 1 (the default) is a clip, not "off" like 0: the first steps' gradient norms are over 1."""
    from safetensors.torch import load_file

    heads = []
    for clip in (1.0, 0.0):
        out = tmp_path / f"clip{clip}"
        train(TrainConfig(draft_vocab_size=64, max_steps=1, ttt_steps=1, batch_size=4, threads=1, warmup_steps=0,
                          grad_clip=clip), peaked_llama, features, out)
        heads.append(load_file(out / "model.safetensors")["lm_head.weight"])
    assert not torch.equal(*heads)
