"""A resume under another draft vocab than the run began with is refused (review s70, h1)."""

from __future__ import annotations

import math
import re
import shutil

import pytest

from drafter_lab.data.vocab import DraftVocab
from drafter_lab.drafter.checkpoint import read_vocab
from drafter_lab.errors import LabError
from drafter_lab.train import state
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import _short, check_transfer, train

CFG = TrainConfig(draft_vocab_size=128, batch_size=4, max_steps=1, ttt_steps=1, warmup_steps=0, threads=1)


@pytest.fixture(scope="module")
def run(peaked_llama, features, tmp_path_factory):
    """A finished run whose draft vocab was built from the data."""
    out = tmp_path_factory.mktemp("vocab_resume") / "run"
    train(CFG, peaked_llama, features, out)
    return out


def test_a_resume_under_another_draft_vocab_is_refused(run, peaked_llama, features, tmp_path):
    """The saved lm_head rows (and the saved d2t, loaded over the new one) went on training against the
    new vocab's teacher rows: a finished run was returned as done, an unfinished one trained on, silently."""
    began = read_vocab(run)
    used = began.used.clone()
    free = [t for t in range(int(used[-1]) + 1, began.target_vocab_size) if t not in set(used.tolist())]
    used[-1] = free[0]  # still ascending: only the last draft id names another token
    other = tmp_path / "other.safetensors"
    DraftVocab.from_used(used, began.target_vocab_size).save(other)
    kept = state.state_path(run).read_bytes()
    said = (f"{run}: --resume with another draft vocab (d2t maps 1 of 128 draft ids to other target tokens; "
            f"draft id 127: target token {int(began.used[-1])} there, {free[0]} now)")
    with pytest.raises(LabError, match=f"^{re.escape(said)}"):
        train(CFG, peaked_llama, features, run, resume=True, vocab=other)
    assert state.state_path(run).read_bytes() == kept

    # the vocab it began with, given now (as the run's own drafter), resumes: the finished run is returned
    assert train(CFG, peaked_llama, features, run, resume=True, vocab=run)["step"] == 1


def test_a_resume_under_a_smaller_draft_vocab_names_the_vocab(run, peaked_llama, features):
    """The drafter's shape check refused it as if another lab version had read the target's config."""
    began = read_vocab(run)
    smaller = DraftVocab.from_used(began.used[:64], began.target_vocab_size)
    said = "--resume with another draft vocab (d2t has 128 draft ids there, 64 now)"
    with pytest.raises(LabError, match=re.escape(said)):
        train(CFG, peaked_llama, features, run, resume=True, vocab=smaller)


def test_a_hash_just_over_12_digits_is_cut_to_its_first_12():
    """`_short`'s hash rule at its edge: 13 hex digits are a hash (cut), 12 are whole already."""
    assert _short("0123456789abc") == "0123456789ab"
    assert _short("0123456789ab") == "0123456789ab"


@pytest.mark.parametrize("l2sp, scale", [(math.inf, None), (None, math.inf), (math.nan, None), (None, -0.5)])
def test_a_transfer_setting_that_means_nothing_is_refused(l2sp, scale):
    with pytest.raises(LabError, match="^l2sp and transfer_lr_scale must be >= 0, got "):
        check_transfer(l2sp, scale, init_from="src")


@pytest.mark.parametrize("scale", [0.0, 0.5, 1e30])
def test_any_finite_learning_rate_scale_from_0_is_taken(scale):
    """0 freezes the transferred weights, below 1 slows them (a preset runs at 0.1): both are settings."""
    check_transfer(1e30, scale, init_from="src")


def test_a_train_state_without_its_d2t_is_refused_as_not_fitting(run, peaked_llama, features, tmp_path):
    """No saved mapping to compare: the state is named as one the drafter cannot load, not a TypeError."""
    out = tmp_path / "run"
    shutil.copytree(run, out)
    saved = state.load(out)
    del saved["model"]["d2t"]
    state.save(out, saved)
    where = re.escape(str(state.state_path(out)))
    with pytest.raises(LabError, match=rf"^{where}: train state does not fit the drafter \(d2t\)$"):
        train(CFG, peaked_llama, features, out, resume=True)
