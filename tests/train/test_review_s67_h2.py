"""Mutation audit of train/ttt.py and train/loop.py (s67, second pass): a batch of the shortest sequences
still scores its one position, a step without a loss position adds nothing to the loss, which the step's
denominators divide and the rank's scale multiplies; a run ends with a line that sums it up, the resume of a
finished run writes nothing, one refused for other data names each difference in a short line, and one from a
state whose weights do not fit the drafter names them; the watch never judges a run's final validation."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.train import loop, state
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.data import collate
from drafter_lab.train.loop import _differences, train
from drafter_lab.train.ttt import CE_SUM, N_LOSS, N_VALID, TTTObjective
from drafter_lab.train.watch import WATCH_FILE, Verdict

from .test_ttt import K, naive_counts, setup


def test_a_batch_of_three_token_sequences_scores_their_one_position():
    """Three tokens (the fewest a run keeps) leave step 0 one position to predict, which counts also in a
    batch of only such sequences (validation batches are sorted by length), where no step has more."""
    d, head, used, examples = setup()
    short = [dataclasses.replace(e, input_ids=e.input_ids[:3], loss_mask=torch.ones(3, dtype=torch.bool),
                                 aux_hidden=e.aux_hidden[:3], final_hidden=e.final_hidden[:3], top1=e.top1[:3])
             for e in examples]
    counts = TTTObjective(d, head[used], K, 0.8)(collate(short))[1]
    want = sum(naive_counts(d, head, used, e, 0.8) for e in short)
    assert counts[0, N_VALID] == len(short)
    torch.testing.assert_close(counts, want, rtol=1e-9, atol=1e-9)


def test_a_step_without_a_loss_position_adds_nothing_and_a_scale_multiplies_the_loss():
    """One loss token, x_3 of five: steps 0 and 1 score it once each, step 2 reaches a position but scores
    none (its share is 0, not 0/0). The step's denominators divide the loss and a rank's scale multiplies it."""
    d, head, used, examples = setup()
    e = examples[0]
    e = dataclasses.replace(e, input_ids=e.input_ids[:5], loss_mask=torch.tensor([0, 0, 0, 1, 0], dtype=torch.bool),
                            aux_hidden=e.aux_hidden[:5], final_hidden=e.final_hidden[:5], top1=used[:5])
    obj, batch = TTTObjective(d, head[used], K, 0.8), collate([e])
    loss, counts = obj(batch)
    want = naive_counts(d, head, used, e, 0.8)
    torch.testing.assert_close(counts, want, rtol=1e-9, atol=1e-9)
    assert want[:3, N_LOSS].tolist() == [1, 1, 0]
    torch.testing.assert_close(loss, want[0, CE_SUM] + 0.8 * want[1, CE_SUM], rtol=1e-9, atol=0)
    torch.testing.assert_close(obj(batch, scale=3.0)[0], 3 * loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(obj(batch, torch.full((K,), 4.0))[0], loss / 4, rtol=1e-12, atol=0)


CFG = TrainConfig(draft_vocab_size=128, batch_size=4, max_steps=2, ttt_steps=2, warmup_steps=0, log_every=1,
                  eval_batch_size=8, keep_best="loss_0", threads=1)


def _files(out) -> dict:
    return {p.relative_to(out): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_run_sums_itself_up_and_its_resume_once_finished_rewrites_nothing(peaked_llama, features, tmp_path,
                                                                            capsys):
    out = tmp_path / "run"
    final = train(CFG, peaked_llama, features, out)
    assert not [k for k in final if k.startswith(("sampled", "replay"))]  # at temperature 0 no chain is sampled
    err = capsys.readouterr().err
    summary = re.search(r"trained 2 steps in \d+s: val cond_acc_0=(\S+) cond_acc_1=(\S+) simulated_accept_len=(\S+) "
                        r"-> (.+)$", err, re.M)
    assert summary, "no summary line"
    assert summary.groups() == (f"{final['cond_acc_0']:.3f}", f"{final['cond_acc_1']:.3f}",
                                f"{final['simulated_accept_len']:.3f}", str(out))
    assert f"best loss_0={final['loss_0']:.4g} at step 2 -> {out / 'best'}\n" in err
    before = _files(out)
    assert train(CFG, peaked_llama, features, out, resume=True) == final
    assert _files(out) == before  # its train state too: a rewrite would change its elapsed_s
    assert "already finished (2 steps)" in capsys.readouterr().err


@pytest.mark.parametrize("edit, named", [(lambda m: m.update(extra=torch.zeros(1)), "extra"),
                                         (lambda m: m.pop("fc.weight"), "fc.weight")])
def test_a_train_state_whose_weights_do_not_fit_is_one_line(peaked_llama, features, tmp_path, edit, named):
    out = tmp_path / "run"
    train(CFG, peaked_llama, features, out)
    saved = state.load(out)
    edit(saved["model"])
    state.save(out, saved)
    where = re.escape(str(state.state_path(out)))
    with pytest.raises(LabError, match=rf"^{where}: train state does not fit the drafter \({re.escape(named)}\)$"):
        train(CFG, peaked_llama, features, out, resume=True)


def test_the_watch_never_judges_a_runs_final_validation(peaked_llama, features, tmp_path, monkeypatch):
    """At its last step a run has nothing left to save by stopping: however far behind its baseline, it
    finishes without a verdict (which would make `train` exit as stopped)."""
    base = tmp_path / "base"
    train(CFG, peaked_llama, features, base)
    monkeypatch.setattr(loop, "judge", lambda *a, **k: Verdict(True, "behind"))
    assert train(CFG, peaked_llama, features, tmp_path / "run", stop_if_behind=base)["step"] == 2
    assert not (tmp_path / "run" / WATCH_FILE).exists()


def test_the_differences_of_two_data_identities_are_named_key_by_key_in_short():
    digest, other = "0123456789abcdef" * 4, "fedcba9876543210" * 4
    before = {"same": 1, "sha": digest, "val": {"n": 3, "path": "x" * 40}, "gone": None, "text": "ABCDEF" * 3,
              "old": {"n": 1}}
    now = {"same": 1, "sha": other, "val": {"n": 4, "path": "y" * 41}, "text": "abcdef" * 3, "new": 0}
    assert _differences(before, now) == [
        "sha 0123456789ab there, fedcba987654 now",  # a hash by its first 12 digits
        "val.n 3 there, 4 now", f"val.path {'x' * 40} there, {'y' * 39}… now",  # over 40 characters cut
        "gone None there, absent now",
        f"text {'ABCDEF' * 3} there, abcdefabcdef now",  # only lowercase hex digits make a hash
        "old {'n': 1} there, absent now",  # a nested identity one side lacks is a value
        "new absent there, 0 now",
    ]
    assert _differences(before, dict(before)) == []
