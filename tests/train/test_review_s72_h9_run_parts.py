"""Fixture-free tests of _Run's smaller parts (the diverged-run check, rank 0's work, keep_best's choice)
and of loop's drafter helpers, each on a tiny real drafter or a bare _Run."""
from __future__ import annotations

import json
import math
import types

import pytest
import torch
from safetensors.torch import load_file

from drafter_lab.drafter.checkpoint import WEIGHTS
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.errors import LabError
from drafter_lab.train import loop
from drafter_lab.train.loop import _Run
from drafter_lab.train.metrics_log import BEST_DIR, BEST_FILE, RUN_FILE


def _dcfg(hidden=16, target_hidden=16) -> DrafterConfig:
    return DrafterConfig(hidden_size=hidden, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=8, draft_vocab_size=4, target_vocab_size=10, target_hidden_size=target_hidden,
                         aux_layer_ids=[0, 1, 2])


class _Target:
    """The two weights _new_drafter reads, distinct per row so a wrong row shows."""

    def __init__(self, hidden=16):
        self.embed = torch.arange(10 * hidden, dtype=torch.float32).reshape(10, hidden)
        self.head = -self.embed

    def embed_weight(self):
        return self.embed

    def lm_head_weight(self):
        return self.head


_D2T = torch.tensor([0, 1, 3, 6])  # draft ids 0..3 -> target ids 0, 2, 5, 9
_T2D = torch.zeros(10, dtype=torch.bool)
_T2D[[0, 2, 5, 9]] = True


def _one_rank(**kw):
    return types.SimpleNamespace(world=1, rank=0, main=True, device=torch.device("cpu"), sum=lambda t: t, **kw)


def _bare_run(tmp_path, **kw) -> _Run:
    run = object.__new__(_Run)
    run.d, run.out_dir, run.step, run.epoch = _one_rank(), tmp_path, 7, 1
    run.nonfinite, run.kept_step = torch.zeros(3, dtype=torch.float64), None
    for k, v in kw.items():
        setattr(run, k, v)
    return run


# ---- check_finite ----------------------------------------------------------------------------------

def test_a_finite_run_passes_the_check(tmp_path):
    _bare_run(tmp_path, cfg=types.SimpleNamespace(grad_clip=0.0)).check_finite()


@pytest.mark.parametrize("nonfinite, grad_clip, kept, said", [
    ([1, math.nan, 3.0], 1.0, None, "loss is nan at step 1: the run diverged (lower --lr); no checkpoint was written"),
    ([5, 2.5, math.inf], 0.0, None, "gradient norm is inf at step 5: the run diverged (lower --lr, or set --grad-clip); "
                "no checkpoint was written"),
    ([5, 2.5, math.inf], 1.0, 4, "gradient norm is inf at step 5: the run diverged (lower --lr); the last checkpoint, step 4, is kept"),
])
def test_a_diverged_step_names_the_value_that_is_not_finite_and_the_cure(tmp_path, nonfinite, grad_clip, kept, said):
    run = _bare_run(tmp_path, cfg=types.SimpleNamespace(grad_clip=grad_clip), kept_step=kept)
    run.nonfinite = torch.tensor(nonfinite, dtype=torch.float64)
    with pytest.raises(LabError, match=said.replace("(", r"\(").replace(")", r"\)")):
        run.check_finite()


def test_a_rank_whose_own_steps_were_finite_stops_at_another_ranks_divergence(tmp_path):
    other = torch.tensor([0.0, 0.0, 0.0, 6, math.inf, math.nan], dtype=torch.float64).reshape(2, 3)  # rank 1's
    run = _bare_run(tmp_path, cfg=types.SimpleNamespace(grad_clip=1.0))
    run.d = types.SimpleNamespace(world=2, rank=0, device=torch.device("cpu"), sum=lambda seen: seen + other)
    with pytest.raises(LabError, match="loss is inf at step 6"):
        run.check_finite()


# ---- rank0 and rank0_writes -------------------------------------------------------------------------

def test_rank_0s_number_reaches_every_rank(tmp_path):
    assert _bare_run(tmp_path).rank0("the work", lambda: 3) == 3.0
    assert _bare_run(tmp_path).rank0("the work", lambda: 0) == 0.0  # 0 is a number, not a failure
    other = _bare_run(tmp_path)  # another rank adds 0 to rank 0's 2
    other.d = types.SimpleNamespace(main=False, device=torch.device("cpu"), sum=lambda t: t + 2.0)
    assert other.rank0("the work", lambda: pytest.fail("only rank 0 works")) == 2.0


def test_writes_that_succeed_are_all_done_in_order(tmp_path):
    done = []
    _bare_run(tmp_path).rank0_writes("it", (tmp_path / "a", lambda: done.append("a")),
                                     (tmp_path / "b", lambda: done.append("b")))
    assert done == ["a", "b"]


def test_rank_0_raises_its_own_exception_and_the_others_name_it(tmp_path):
    with pytest.raises(KeyError, match="boom"):
        _bare_run(tmp_path).rank0("the work", lambda: {}["boom"])
    other = _bare_run(tmp_path)
    other.d = types.SimpleNamespace(main=False, device=torch.device("cpu"),
                                    sum=lambda t: torch.full((), -1.0, dtype=torch.float64))
    with pytest.raises(LabError, match="the work failed on rank 0 at step 7"):
        other.rank0("the work", lambda: pytest.fail("only rank 0 works"))


def test_a_write_that_fails_names_its_path_and_the_writes_before_it_are_done(tmp_path):
    done = []

    def full():
        raise OSError(28, "No space left on device")

    with pytest.raises(LabError, match=r"cannot be written \(No space left on device\)") as e:
        _bare_run(tmp_path).rank0_writes("it", (tmp_path / "a", lambda: done.append("a")), (tmp_path / "b", full),
                                         (tmp_path / "c", lambda: done.append("c")))
    assert done == ["a"] and str(tmp_path / "b") in str(e.value)


# ---- keep_if_best -----------------------------------------------------------------------------------

def _keeper(tmp_path, metric):
    torch.manual_seed(0)
    return _bare_run(tmp_path, cfg=types.SimpleNamespace(keep_best=metric), best=None,
                     drafter=loop.Eagle3Drafter(_dcfg()), info={"run": 1})


@pytest.mark.parametrize("metric, values, kept", [
    ("cond_acc_0", [0.5, 0.7, 0.7, 0.6], 0.7),  # higher is better; a tie keeps the earlier
    ("loss_0", [2.0, 1.5, 1.5, 1.8], 1.5),  # lower is better
])
def test_keep_best_keeps_the_better_and_a_tie_keeps_the_earlier(tmp_path, metric, values, kept):
    run = _keeper(tmp_path, metric)
    for step, v in enumerate(values, 1):
        run.step = step
        with torch.no_grad():
            run.drafter.fc.weight.fill_(step)  # marks the weights each validation saw
        run.keep_if_best({metric: v, "positions": 3})
    saved = load_file(tmp_path / BEST_DIR / WEIGHTS)
    assert any(t.shape == run.drafter.fc.weight.shape and bool((t == 2).all()) for t in saved.values())
    record = json.loads((tmp_path / BEST_DIR / BEST_FILE).read_text())
    assert (record["value"], record["step"], record["metric"]) == (kept, 2, metric)
    assert record["validation"] == {metric: kept, "positions": 3}
    assert json.loads((tmp_path / BEST_DIR / RUN_FILE).read_text()) == {"run": 1}
    assert run.best == {"metric": metric, "value": kept, "step": 2, "epoch": 1}


@pytest.mark.parametrize("metric, m, main", [
    ("", {"cond_acc_0": 0.5, "positions": 3}, True),
    ("cond_acc_0", {"cond_acc_0": 0.5, "positions": 3}, False),
    ("cond_acc_0", {"cond_acc_0": math.nan, "positions": 3}, True),
    ("cond_acc_0", {"cond_acc_0": 0.0, "positions": 0}, True),
])
def test_keep_best_keeps_nothing_off_rank_0_unset_nan_or_unscored(tmp_path, metric, m, main):
    run = _keeper(tmp_path, metric)
    run.cfg.keep_best = metric
    run.d.main = main
    run.keep_if_best(m)
    assert run.best is None and not (tmp_path / BEST_DIR).exists()


# ---- _kept_best ------------------------------------------------------------------------------------

def _kept(tmp_path, record):
    (tmp_path / BEST_DIR).mkdir(exist_ok=True)
    (tmp_path / BEST_DIR / BEST_FILE).write_text(json.dumps(record))


def test_a_kept_record_counts_only_under_its_own_metric(tmp_path):
    assert loop._kept_best(tmp_path, "cond_acc_0") is None  # none kept
    _kept(tmp_path, {"metric": "cond_acc_0", "value": 0.5, "step": 2})
    assert loop._kept_best(tmp_path, "cond_acc_0")["value"] == 0.5
    assert loop._kept_best(tmp_path, "loss_0") is None
    assert loop._kept_best(tmp_path, "") is None


@pytest.mark.parametrize("record", [[1, 2], {"metric": "cond_acc_0", "value": True, "step": 2},
                                    {"metric": "cond_acc_0", "value": "0.5", "step": 2},
                                    {"metric": "cond_acc_0", "value": 0.5, "step": 2.0}])
def test_a_kept_record_without_a_numeric_value_and_an_int_step_is_refused(tmp_path, record):
    _kept(tmp_path, record)
    with pytest.raises(LabError, match="not the record of a kept drafter") as e:
        loop._kept_best(tmp_path, "cond_acc_0")
    assert str(tmp_path / BEST_DIR / BEST_FILE) in str(e.value)


# ---- _new_drafter and _load_model -------------------------------------------------------------------

def _cfg(seed=0, head=False):
    return types.SimpleNamespace(seed=seed, init_lm_head_from_target=head)


def test_a_drafter_of_the_targets_width_takes_its_embedding_frozen_and_its_head_rows():
    drafter = loop._new_drafter(_cfg(head=True), _dcfg(), _Target(), _D2T, _T2D)
    assert torch.equal(drafter.embed_tokens.weight, _Target().embed) and loop._embed_frozen(drafter)
    assert torch.equal(drafter.lm_head.weight, _Target().head[[0, 2, 5, 9]])
    assert torch.equal(drafter.d2t, _D2T) and torch.equal(drafter.t2d, _T2D)


def test_a_narrower_drafter_learns_its_own_embedding_and_cannot_take_the_targets_head():
    drafter = loop._new_drafter(_cfg(), _dcfg(hidden=8), _Target(), _D2T, _T2D)
    w = drafter.embed_tokens.weight
    assert not loop._embed_frozen(drafter) and 0.005 < w.std().item() < 0.05 and abs(w.mean().item()) < 0.01
    with pytest.raises(LabError, match=r"^init_lm_head_from_target needs the drafter hidden size \(8\) to equal the "
                                       r"target's \(16\)$"):
        loop._new_drafter(_cfg(head=True), _dcfg(hidden=8), _Target(), _D2T, _T2D)


def test_the_same_seed_builds_the_same_drafter():
    a, b, c = (loop._new_drafter(_cfg(seed=s), _dcfg(hidden=8), _Target(), _D2T, _T2D) for s in (1, 1, 2))
    assert torch.equal(a.fc.weight, b.fc.weight) and not torch.equal(a.fc.weight, c.fc.weight)
    assert torch.equal(a.embed_tokens.weight, b.embed_tokens.weight)


def test_a_state_without_the_frozen_embedding_loads_and_any_other_gap_is_named(tmp_path):
    src = loop._new_drafter(_cfg(seed=1), _dcfg(), _Target(), _D2T, _T2D)
    state = {k: v for k, v in src.state_dict().items() if k != "embed_tokens.weight"}
    dst = loop._new_drafter(_cfg(seed=2), _dcfg(), _Target(), _D2T, _T2D)
    loop._load_model(dst, state, tmp_path / "state.pt")
    assert torch.equal(dst.fc.weight, src.fc.weight)
    with pytest.raises(LabError, match=r"train state does not fit the drafter \(fc.weight, extra\)") as e:
        loop._load_model(dst, {**{k: v for k, v in state.items() if k != "fc.weight"}, "extra": torch.zeros(1)},
                         tmp_path / "state.pt")
    assert str(tmp_path / "state.pt") in str(e.value)
    own = loop._new_drafter(_cfg(), _dcfg(hidden=8), _Target(), _D2T, _T2D)  # its embedding is trained: kept
    with pytest.raises(LabError, match=r"\(embed_tokens.weight\)"):
        loop._load_model(own, {k: v for k, v in own.state_dict().items() if k != "embed_tokens.weight"}, tmp_path)


# ---- record -----------------------------------------------------------------------------------------

class _Board:
    """What a SummaryWriter was given."""

    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))


@pytest.mark.parametrize("step, event, lr", [(0, "val", 2.5e-4), (2, "train", 5e-4)])
def test_a_line_holds_the_lr_of_the_step_it_ends_and_the_board_its_float_metrics(tmp_path, step, event, lr):
    run = _bare_run(tmp_path, cfg=types.SimpleNamespace(lr=1e-3, warmup_steps=4, min_lr_ratio=0.1), total=10,
                    tokens=99, t0=0.0, metrics=loop.MetricsLog(tmp_path / "metrics.jsonl"), tb=_Board())
    run.step = step
    run.record(event, {"loss_0": 1.5, "positions": 3})
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    split = "val" if event == "val" else "train"
    assert {k: row[k] for k in ("event", "split", "step", "epoch", "train_tokens", "loss_0", "positions")} == {
        "event": event, "split": split, "step": step, "epoch": 1, "train_tokens": 99, "loss_0": 1.5, "positions": 3}
    assert row["lr"] == pytest.approx(lr)
    assert run.tb.scalars == [(f"{split}/loss_0", 1.5, step)]
    run.tb = None  # tensorboard off: the line alone
    run.record(event, {"loss_0": 1.0})
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
