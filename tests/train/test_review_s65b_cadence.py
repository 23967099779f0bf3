"""When a run logs, validates and checkpoints: every log_every / eval_every / checkpoint_every steps, and
once more at a last step off that cadence (mutation audit, s65 second pass)."""

from __future__ import annotations

from drafter_lab.train import loop, state
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics_log import read_metrics

# 5 steps, inside the first epoch (36 train sequences in batches of 4).
CFG = TrainConfig(draft_vocab_size=128, batch_size=4, max_steps=5, ttt_steps=1, warmup_steps=0, log_every=2,
                  eval_every=2, checkpoint_every=2, eval_batch_size=8, threads=1)


def test_a_last_step_off_the_cadence_is_logged_validated_and_checkpointed(monkeypatch, tmp_path, peaked_llama,
                                                                          features):
    kept = []
    real = loop._Run.checkpoint

    def checkpoint(self):
        real(self)
        kept.append((self.step, state.load(self.out_dir)["step"]))

    monkeypatch.setattr(loop._Run, "checkpoint", checkpoint)
    final = train(CFG, peaked_llama, features, tmp_path / "run")
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows if r["event"] == "train"] == [2, 4, 5]
    assert [r["step"] for r in rows if r["event"] == "val"] == [2, 4, 5]
    assert kept == [(2, 2), (4, 4), (5, 5)]
    assert final["step"] == 5


def test_norms_and_biases_get_no_weight_decay_and_transferred_weights_the_scaled_rate():
    import torch

    from drafter_lab.train.loop import _param_groups

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2, bias=False))
    net[2].weight.requires_grad_(False)  # frozen: in no group
    cfg = TrainConfig(lr=1e-3, weight_decay=0.1)
    groups = _param_groups(net, {"0.weight", "0.bias"}, cfg, 0.5)
    got = {(g["lr"], g["weight_decay"]): sorted(n for n, p in net.named_parameters() if any(p is q for q in g["params"]))
           for g in groups}
    assert got == {(1e-3, 0.0): ["1.bias", "1.weight"], (5e-4, 0.0): ["0.bias"], (5e-4, 0.1): ["0.weight"]}


def test_the_watch_never_judges_a_runs_last_validation(monkeypatch, tmp_path, peaked_llama, features):
    """A run at its end has nothing left to save by stopping: its last validation is not judged (no
    watch.json, no "stopped by the watch" for a finished run)."""
    train(CFG, peaked_llama, features, tmp_path / "base")
    judged = []
    real = loop._Run.check_watch

    def check_watch(self):
        judged.append(self.step)
        real(self)

    monkeypatch.setattr(loop._Run, "check_watch", check_watch)
    train(CFG, peaked_llama, features, tmp_path / "run", stop_if_behind=tmp_path / "base")
    assert judged == [2, 4]


def test_the_watch_judges_on_its_axis_against_the_runs_planned_length_on_it(monkeypatch, tmp_path, peaked_llama,
                                                                           features):
    """By train_tokens, "parity after the run" means after the run's planned tokens, not its steps."""
    import json

    from drafter_lab.train.watch import WatchConfig

    train(CFG, peaked_llama, features, tmp_path / "base")
    totals = []
    real = loop.judge

    def judge(run_rows, base_rows, cfg, total, *a, **kw):
        totals.append(total)
        return real(run_rows, base_rows, cfg, total, *a, **kw)

    monkeypatch.setattr(loop, "judge", judge)
    train(CFG, peaked_llama, features, tmp_path / "run", stop_if_behind=tmp_path / "base",
          watch=WatchConfig(watch_axis="train_tokens"))
    planned = json.loads((tmp_path / "run" / "run.json").read_text())["total_tokens"]
    assert planned > CFG.max_steps and totals[1:] == [planned, planned]  # the first: the baseline's check
