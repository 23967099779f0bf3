"""Mutation audit (review s65): a validation that scored nothing reads 0 (not 1, not NaN) in its
accuracies and accept lengths, "positions" is step 0's, ranks split the set, `evaluate` leaves the drafter
as it found it; metrics.jsonl on ranks that do not write, blank lines, and a boolean step."""

from __future__ import annotations

import math
import re

import pytest
import torch

from drafter_lab.data.shards import Sequence
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.errors import LabError
from drafter_lab.train import distributed
from drafter_lab.train.config import TrainConfig, check_metric
from drafter_lab.train.data import Examples
from drafter_lab.train.metrics import eval_counts, evaluate, metric_names, summarize, weighted_loss
from drafter_lab.train.metrics_log import MetricsLog, read_metrics
from drafter_lab.train.ttt import N_COLS, N_VALID, TTTObjective

H, V = 32, 64


def _drafter():
    cfg = DrafterConfig(hidden_size=H, target_hidden_size=H, intermediate_size=64, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, draft_vocab_size=V, target_vocab_size=V,
                        aux_layer_ids=[1, 2, 3])
    torch.manual_seed(3)
    drafter = Eagle3Drafter(cfg)
    drafter.t2d.fill_(True)
    return drafter


def _sequences(lengths, first_loss: int | None = None):
    """Random sequences whose loss positions start at `first_loss` (None: each one's middle)."""
    g = torch.Generator().manual_seed(4)
    out = []
    for i, T in enumerate(lengths):
        mask = torch.zeros(T, dtype=torch.bool)
        mask[T // 2 if first_loss is None else first_loss:] = True
        out.append(Sequence(seq_id=str(i), input_ids=torch.randint(0, V, (T,), generator=g), loss_mask=mask,
                            aux_hidden=torch.randn(T, 3 * H, generator=g), final_hidden=torch.randn(T, H, generator=g)))
    return out


def test_a_validation_that_scored_nothing_reads_zero_accuracies_and_accept_lengths():
    """The cost model prices such a drafter as one that never hits: a 1.0 per step would price it as
    always accepted, a NaN would not price it."""
    m = summarize(torch.zeros(3, N_COLS), sampled=True, replay=True)
    assert m["positions"] == 0
    assert all(math.isnan(m[f"loss_{k}"]) for k in range(3))
    zero = [f"{p}_{k}" for p in ("acc", "cond_acc", "sampled_acc", "replay_accept_len") for k in range(3)]
    zero += ["simulated_accept_len", "sampled_accept_len", "replay_accept_len"]
    assert {k: m[k] for k in zero} == dict.fromkeys(zero, 0.0)


def test_positions_are_step_0s_though_the_last_steps_scored_none():
    """A set too short for the last steps still scored positions: keep_best and the watch skip only a
    validation with "positions" 0."""
    counts = torch.zeros(3, N_COLS)
    counts[:, N_VALID] = torch.tensor([7.0, 3.0, 0.0])
    assert summarize(counts)["positions"] == 7


def test_keep_best_may_name_the_weighted_loss():
    assert metric_names(2)[-1] == "weighted_loss"
    check_metric(TrainConfig(), "keep_best", "weighted_loss")


class _Rank(distributed.Dist):
    def sum(self, t):  # this rank's share alone
        return t


class _Tenfold(distributed.Dist):
    def sum(self, t):  # stands for the other ranks' shares
        return 10 * t


def test_ranks_split_the_validation_set_and_count_it_once_together():
    drafter = _drafter()
    head = torch.randn(V, H, generator=torch.Generator().manual_seed(5))
    examples = Examples(_sequences((9, 12, 10, 14, 11)), head, 64, device=torch.device("cpu"))
    obj = TTTObjective(drafter, head, 3, 0.8)
    whole = eval_counts(obj, examples, 2, distributed.Dist(0, 1, 0, torch.device("cpu")), torch.no_grad())
    shares = [eval_counts(obj, examples, 2, _Rank(r, 2, r, torch.device("cpu")), torch.no_grad()) for r in (0, 1)]
    assert all(0 < s[0, N_VALID] < whole[0, N_VALID] for s in shares)
    torch.testing.assert_close(shares[0] + shares[1], whole)
    reduced = eval_counts(obj, examples, 2, _Tenfold(0, 1, 0, torch.device("cpu")), torch.no_grad())
    torch.testing.assert_close(reduced, 10 * whole)  # what the ranks return is the all-reduced sum


def test_evaluate_scores_the_drafters_vocab_rows_of_the_head():
    """A draft vocab of the target's last N tokens (d2t offsets): `evaluate` gives what training's
    objective counts with those rows of the head, not with its first N."""
    N = 48
    cfg = DrafterConfig(hidden_size=H, target_hidden_size=H, intermediate_size=64, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, draft_vocab_size=N, target_vocab_size=V,
                        aux_layer_ids=[1, 2, 3])
    torch.manual_seed(3)
    drafter = Eagle3Drafter(cfg)
    drafter.d2t.fill_(V - N)
    drafter.t2d.zero_()
    drafter.t2d[V - N:] = True
    head = torch.randn(V, H, generator=torch.Generator().manual_seed(6))
    seqs = _sequences((9, 12, 10))
    examples = Examples(seqs, head, 64, device=torch.device("cpu"))
    want = eval_counts(TTTObjective(drafter, head[V - N:], 2, 0.8), examples, 16,
                       distributed.Dist(0, 1, 0, torch.device("cpu")), torch.no_grad())
    got = evaluate(drafter, head, seqs, 2)
    assert got == pytest.approx(summarize(want), nan_ok=True)
    assert got != pytest.approx(summarize(eval_counts(TTTObjective(drafter, head[:N], 2, 0.8), examples, 16,
                                                      distributed.Dist(0, 1, 0, torch.device("cpu")),
                                                      torch.no_grad())), nan_ok=True)


def test_a_step_whose_loss_is_infinite_makes_the_weighted_loss_infinite():
    """Only a step that scored nothing (NaN) is left out: a diverged one must not read as a finite loss."""
    assert weighted_loss({"loss_0": 1.0, "loss_1": math.inf}, 2, 0.8) == math.inf


@pytest.mark.parametrize("training", [True, False])
def test_evaluate_leaves_the_drafter_in_the_mode_it_found(training):
    drafter = _drafter().train(training)
    evaluate(drafter, torch.randn(V, H), _sequences((9, 12)), 2)
    assert drafter.training is training


def test_evaluate_on_sequences_too_short_for_a_step_is_one_line():
    with pytest.raises(LabError, match="^no sequences long enough to evaluate on$"):
        evaluate(_drafter(), torch.randn(V, H), _sequences((2, 2)), 2)


def test_a_log_that_is_not_the_writers_leaves_the_file_alone(tmp_path):
    """Ranks other than 0 hold a disabled log on the same file: they neither write, size nor cut it."""
    path = tmp_path / "metrics.jsonl"
    MetricsLog(path, enabled=False).write({"step": 1})
    assert not path.exists()
    path.write_text('{"step": 1}\n')
    off = MetricsLog(path, enabled=False)
    assert off.sync_size() == 0
    off.truncate(3)
    assert read_metrics(path) == [{"step": 1}]


def test_blank_lines_are_skipped(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n\n  \r\n{"step": 2}\n')
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_a_boolean_step_is_not_a_step(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": true}\n')
    with pytest.raises(LabError, match='line 2 is not a metrics record: "step" true is not an integer'):
        read_metrics(tmp_path)


@pytest.mark.parametrize("line, problem", [
    ('{"step": 1, "x": ' + "9" * 5000 + "}", "Exceeds the limit (4300 digits)"),  # was int()'s ValueError
    ("[" * 200_000, "maximum recursion depth exceeded"),  # was a RecursionError traceback
])
def test_json_that_python_cannot_read_is_one_line_naming_the_file(tmp_path, line, problem):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n' + line + "\n")
    with pytest.raises(LabError, match=re.escape(f"line 2 is not valid JSON ({problem}")) as e:
        read_metrics(tmp_path)
    assert str(tmp_path / "metrics.jsonl") in str(e.value)


@pytest.mark.parametrize("line", ["5", '"step"', "null"])
def test_a_line_that_is_not_an_object_is_one_line(tmp_path, line):
    (tmp_path / "metrics.jsonl").write_text(f'{{"step": 1}}\n{line}\n')
    with pytest.raises(LabError, match=re.escape("line 2 is not a metrics record (a JSON object)")):
        read_metrics(tmp_path)


def test_the_size_a_checkpoint_records_is_synced_to_disk_first(tmp_path, monkeypatch):
    """A power cut after the state's save must not leave metrics.jsonl shorter than the state recorded:
    the resume would refuse it."""
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"step": 1})
    synced = []
    monkeypatch.setattr("drafter_lab.train.metrics_log.os.fsync", synced.append)
    assert log.sync_size() == log.path.stat().st_size > 0
    assert len(synced) == 1


@pytest.mark.parametrize("step", [-1, 2**63, 10**400])
def test_a_step_past_any_run_is_refused_naming_the_line(tmp_path, step):
    """A hand-edited step of 10**400 read, then the watch's float of it was an OverflowError traceback."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "loss": 1.0}\n' + f'{{"step": {step}, "loss": 1.0}}\n')
    with pytest.raises(LabError, match=rf'^{path}: line 2 is not a metrics record: "step" {step} is not a step'):
        read_metrics(path)
