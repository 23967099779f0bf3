"""_Run.validate on a bare one-rank _Run with a tiny real drafter and in-memory validation sequences:
the drafter's mode around it, which metrics a sampled validation adds, the weighted loss it records, and
the watch it asks before the run's last step."""
from __future__ import annotations

import contextlib
import json
import types

import pytest
import torch

from drafter_lab.data.shards import Sequence
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.train import distributed
from drafter_lab.train.data import Examples
from drafter_lab.train.loop import _Run
from drafter_lab.train.metrics_log import METRICS, MetricsLog
from drafter_lab.train.ttt import TTTObjective
from drafter_lab.train.watch import WATCH_FILE, WatchConfig

H, V = 16, 32


def _sequences():
    g = torch.Generator().manual_seed(7)
    out = []
    for i, T in enumerate((9, 12, 10)):
        mask = torch.zeros(T, dtype=torch.bool)
        mask[T // 3:] = True
        out.append(Sequence(seq_id=str(i), input_ids=torch.randint(0, V, (T,), generator=g), loss_mask=mask,
                            aux_hidden=torch.randn(T, 3 * H, generator=g), final_hidden=torch.randn(T, H, generator=g)))
    return out


def _validating(tmp_path, temperature: float) -> _Run:
    """A bare one-rank _Run at step 3 of 10 that validates at `temperature`, no keep_best, no watch."""
    torch.manual_seed(3)
    drafter = Eagle3Drafter(DrafterConfig(
        hidden_size=H, target_hidden_size=H, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
        head_dim=8, draft_vocab_size=V, target_vocab_size=V, aux_layer_ids=[1, 2, 3]))
    drafter.t2d.fill_(True)
    head = torch.randn(V, H, generator=torch.Generator().manual_seed(5))
    run = object.__new__(_Run)
    run.d = distributed.Dist(rank=0, world=1, local_rank=0, device=torch.device("cpu"))
    run.cfg = types.SimpleNamespace(eval_batch_size=2, val_temperature=temperature, ttt_steps=2, loss_decay=0.5,
                                    lr=1e-3, warmup_steps=0, min_lr_ratio=0.1, grad_clip=1.0, keep_best="")
    run.drafter, run.replay, run.watch, run.autocast = drafter, False, None, contextlib.nullcontext()
    run.obj = TTTObjective(drafter, head, 2, 0.5, temperature)
    run.val_ex = Examples(_sequences(), head, 64, device=torch.device("cpu"), temperature=temperature)
    run.out_dir, run.step, run.epoch, run.tokens, run.total, run.t0, run.tb = tmp_path, 3, 0, 60, 10, 0.0, None
    run.nonfinite, run.kept_step = torch.zeros(3, dtype=torch.float64), None
    run.metrics = MetricsLog(tmp_path / METRICS)
    return run


def test_validation_runs_the_drafter_in_eval_mode_and_gives_it_back_training(tmp_path):
    """A drafter with a mode of its own (dropout) would otherwise validate noisily, or train on in eval mode."""
    run = _validating(tmp_path, 0.0)
    modes = []
    run.drafter.fc.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    run.drafter.train()
    run.validate()
    assert modes and not any(modes)
    assert run.drafter.training


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_sampled_validation_alone_adds_the_sampled_metrics(tmp_path, temperature):
    run = _validating(tmp_path, temperature)
    run.validate()
    row = json.loads((tmp_path / METRICS).read_text())
    assert ("sampled_acc_0" in row, "sampled_accept_len" in row) == (temperature > 0,) * 2
    assert ("sampled_acc_0" in run.last_val) == (temperature > 0)


def test_the_validation_line_records_the_weighted_loss_of_its_own_steps(tmp_path):
    """sum_k decay**k * loss_k, what keep_best and the watch may compare by."""
    run = _validating(tmp_path, 0.0)
    run.validate()
    row = json.loads((tmp_path / METRICS).read_text())
    assert row["positions"] > 0 and row["loss_1"] > 0
    assert row["weighted_loss"] == pytest.approx(row["loss_0"] + 0.5 * row["loss_1"])
    assert run.last_val["weighted_loss"] == row["weighted_loss"]
    assert (row["event"], row["split"], row["step"]) == ("val", "val", 3)


def _val_rows(path, points):
    path.mkdir(exist_ok=True)
    rows = [{"event": "val", "split": "val", "step": s, "train_tokens": s, "cond_acc_0": v, "positions": 5}
            for s, v in points.items()]
    (path / METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_validation_before_the_last_step_asks_the_watch(tmp_path):
    """Behind its baseline at 200 and 300 and further behind now (the random drafter's cond_acc_0 at 400):
    the watch stops the run at this validation, with its verdict on disk."""
    run = _validating(tmp_path, 0.0)
    _val_rows(tmp_path, {200: 0.55, 300: 0.58})
    base = _val_rows(tmp_path / "base", {0: 0.0, 100: 0.5, 200: 0.6, 300: 0.66, 400: 0.7, 500: 0.72})
    run.watch, run.step, run.total, run.total_tokens, run.stop_reason = (base, WatchConfig()), 400, 2000, 2000, None
    run.validate()
    assert run.stop_reason and "behind at steps 200 / 300 / 400" in run.stop_reason
    assert json.loads((tmp_path / WATCH_FILE).read_text())["step"] == 400
