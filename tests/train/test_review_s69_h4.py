"""train()'s draft vocab refused naming where it came from, and keep_best's record refused with a bool
step (review s69, h4)."""

from __future__ import annotations

import dataclasses
import json
import re
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.data.vocab import vocab_from_counts
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target
from drafter_lab.train import loop
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train

CFG = TrainConfig(draft_vocab_size=128, batch_size=4, max_steps=1, ttt_steps=1, warmup_steps=0, threads=1)


@pytest.fixture(scope="module")
def good(peaked_llama):
    """A draft vocab of the peaked target: every id counted once, so the lowest 128."""
    return vocab_from_counts(torch.ones(load_target(peaked_llama, tokenizer=False).vocab_size), 128)


def test_a_vocab_file_trains_and_its_refusals_name_it(tmp_path, peaked_llama, features, good):
    path = tmp_path / "vocab.safetensors"
    good.save(path)
    train(CFG, peaked_llama, features, tmp_path / "run", vocab=path)
    assert torch.equal(load_file(tmp_path / "run" / "model.safetensors")["d2t"], good.d2t)
    # the run's own directory is a drafter: its mapping is read as engines read it
    train(CFG, peaked_llama, features, tmp_path / "again", vocab=tmp_path / "run")
    assert torch.equal(load_file(tmp_path / "again" / "model.safetensors")["d2t"], good.d2t)

    other = tmp_path / "other.safetensors"
    vocab_from_counts(torch.ones(good.target_vocab_size + 1), 128).save(other)
    with pytest.raises(LabError, match=f"^{re.escape(str(other))}: draft vocab maps a {good.target_vocab_size + 1}-token"):
        train(CFG, peaked_llama, features, tmp_path / "o", vocab=other)
    split = tmp_path / "split.safetensors"
    save_file({"d2t": good.d2t[:127].contiguous(), "t2d": good.t2d}, split)
    with pytest.raises(LabError, match=f"^{re.escape(str(split))}: d2t and t2d disagree"):
        train(CFG, peaked_llama, features, tmp_path / "s", vocab=str(split))
    assert not any((tmp_path / n).exists() for n in "os")


def test_a_given_vocab_of_another_target_does_not_blame_the_data(tmp_path, peaked_llama, features, good):
    """The data directory was named as if its train split had made the vocab."""
    other = vocab_from_counts(torch.ones(good.target_vocab_size + 1), 128)
    with pytest.raises(LabError, match="^draft vocab maps a") as e:
        train(CFG, peaked_llama, features, tmp_path / "run", vocab=other)
    assert str(features) not in str(e.value)


@pytest.mark.parametrize("shift, error", [(10**6, "outside the target vocab"), (-1, "to the same target token")])
def test_a_given_vocab_whose_d2t_is_wrong_is_one_line(tmp_path, peaked_llama, features, good, shift, error):
    """t2d's count agreed with d2t's length: a d2t past the target vocab was an IndexError traceback at the
    teacher's lm_head rows; two draft ids of one token trained a drafter whose two rows mean one token."""
    d2t = good.d2t.clone()
    d2t[-1] += shift
    with pytest.raises(LabError, match=f"^d2t maps .*{error}"):
        train(CFG, peaked_llama, features, tmp_path / "run", vocab=dataclasses.replace(good, d2t=d2t))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("step", ["true", "false"])
def test_a_kept_record_with_a_bool_step_is_refused(tmp_path, step):
    """JSON true is an int to Python: the resume took it as the kept step ("best ... at step True")."""
    record = tmp_path / "best" / "best.json"
    record.parent.mkdir()
    record.write_text('{"metric": "cond_acc_0", "value": 0.5, "step": ' + step + ', "epoch": 0}')
    with pytest.raises(LabError, match=f"^{re.escape(str(record))}: not the record of a kept drafter"):
        loop._kept_best(tmp_path, "cond_acc_0")
    record.write_text('{"metric": "cond_acc_0", "value": 0.5, "step": 2, "epoch": 0}')
    assert loop._kept_best(tmp_path, "cond_acc_0")["step"] == 2


def test_tensorboard_without_its_package_is_one_line_before_anything_is_written(monkeypatch, tmp_path, peaked_llama,
                                                                                 features):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # its import fails as if not installed
    with pytest.raises(LabError, match=r"^tensorboard = true needs the tensorboard package \(pip install"):
        train(dataclasses.replace(CFG, tensorboard=True), peaked_llama, features, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_head_dim_its_default_gives_trains_as_one_not_given(tmp_path, peaked_llama, features):
    """train() settles the config before a resume compares it and run.json records it: a run begun without
    drafter_head_dim resumes with the target's given (as a --draft-config or the pilot now sets it)."""
    given = dataclasses.replace(CFG, drafter_head_dim=16)  # the shared target's: hidden 64, 4 heads
    train(CFG, peaked_llama, features, tmp_path / "run")
    train(given, peaked_llama, features, tmp_path / "run", resume=True)
    train(given, peaked_llama, features, tmp_path / "again")
    assert json.loads((tmp_path / "again" / "run.json").read_text())["config"]["drafter_head_dim"] == 0


def test_an_l2sp_under_one_still_pulls(tmp_path, peaked_llama, features):
    """Any l2sp > 0 anchors the transferred weights (the test beside it pulls with 1e4 alone): after the first
    step, where weights and anchors are equal, the pull changes every later one."""
    cfg = dataclasses.replace(CFG, max_steps=3)
    train(CFG, peaked_llama, features, tmp_path / "src")
    for l2sp in (0.0, 0.5):
        train(cfg, peaked_llama, features, tmp_path / str(l2sp), init_from=tmp_path / "src", l2sp=l2sp)
    free, pulled = (load_file(tmp_path / name / "model.safetensors") for name in ("0.0", "0.5"))
    assert not torch.equal(free["midlayer.mlp.up_proj.weight"], pulled["midlayer.mlp.up_proj.weight"])


def test_a_remap_by_token_is_recorded(monkeypatch, tmp_path, peaked_llama, features):
    """run.json and the train state say a transfer remapped by token string, so that a resume remapping by
    id is refused. The two tokenizers stand in as differing (ids unmoved): building a second tokenizer's
    target and features here would cost more than the record it pins."""
    train(CFG, peaked_llama, features, tmp_path / "src")
    monkeypatch.setattr(loop, "source_tokens", lambda source, source_target, target: (
        torch.arange(target.vocab_size), "--source-target"))
    train(CFG, peaked_llama, features, tmp_path / "run", init_from=tmp_path / "src")
    assert json.loads((tmp_path / "run" / "run.json").read_text())["init_from"]["remap_by"] == "token"
    monkeypatch.setattr(loop, "source_tokens", lambda *args: (None, None))
    with pytest.raises(LabError, match="remap_by token there, id now"):
        train(CFG, peaked_llama, features, tmp_path / "run", init_from=tmp_path / "src", resume=True)


def test_a_baseline_the_watch_cannot_judge_is_refused_before_anything_is_written(tmp_path, peaked_llama, features):
    """Judged first at the run's first validation, after its directory was made."""
    from drafter_lab.train.watch import WatchConfig

    metric = WatchConfig().watch_metric
    train(CFG, peaked_llama, features, tmp_path / "base")
    metrics = tmp_path / "base" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    metrics.write_text("".join(json.dumps({**r, metric: "high"} if r["split"] == "val" else r) + "\n" for r in rows))
    with pytest.raises(LabError, match=f"^{re.escape(str(tmp_path / 'base'))}.*has {metric} \"high\", not a number"):
        train(CFG, peaked_llama, features, tmp_path / "run", stop_if_behind=tmp_path / "base")
    assert not (tmp_path / "run").exists()
