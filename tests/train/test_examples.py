"""Training reads features a batch at a time, the next one ahead: what it reads equals the shards,
and no more is read."""

from __future__ import annotations

import json
import shutil
import threading

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from drafter_lab.cli import main
from drafter_lab.data.shards import FeatureSet, Manifest, ShardReader
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target_head
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.data import Examples, Prefetcher
from drafter_lab.train.loop import train
from drafter_lab.train.metrics_log import read_metrics


def test_examples_read_from_shards_equal_the_shards(peaked_llama, features):
    fs = FeatureSet(features)
    head = load_target_head(peaked_llama).lm_head_weight().float()
    refs = fs.index("train")
    ex = Examples(refs, head, max_length=20)
    got = ex.take(list(range(len(ex))))
    again = ex.take([len(ex) - 1, 0])  # any order, and a second time (the top-1 from its cache)
    assert all(torch.equal(a.top1, b.top1) and torch.equal(a.aux_hidden, b.aux_hidden)
               for a, b in zip(again, [got[-1], got[0]]))
    want = []
    for row in fs.manifest.shards["train"]:  # the oracle: whole shards read by safetensors, cut by offsets
        t = load_file(str(fs.dir / row["file"]))
        o = t["offsets"].tolist()
        want += [{k: t[k][a:min(b, a + 20)] for k in ("input_ids", "loss_mask", "aux_hidden", "final_hidden")}
                 for a, b in zip(o, o[1:]) if min(b - a, 20) >= 3]
    assert len(got) == len(want) == len(ex.lengths) > 0
    for e, w in zip(got, want):
        assert torch.equal(e.input_ids, w["input_ids"].long()) and torch.equal(e.loss_mask, w["loss_mask"].bool())
        assert torch.equal(e.aux_hidden, w["aux_hidden"]) and torch.equal(e.final_hidden, w["final_hidden"])
        assert torch.equal(e.top1, (w["final_hidden"].float() @ head.T).argmax(-1))


def test_training_reads_only_its_batches(peaked_llama, features, tmp_path, monkeypatch):
    reads = []
    real = ShardReader.read
    monkeypatch.setattr(ShardReader, "read", lambda self, ref, n=None: reads.append(ref) or real(self, ref, n))
    cfg = TrainConfig(draft_vocab_size=128, batch_size=4, max_steps=2, ttt_steps=2, eval_every=0, threads=1)
    train(cfg, peaked_llama, features, tmp_path / "run")
    fs = FeatureSet(features)
    n_train, n_val = len(fs.index("train")), len(fs.index("val"))
    assert n_train > 16
    assert len(reads) == 2 * 4 + n_val  # two batches of 4, then one validation pass


def test_prefetch_changes_when_batches_load_not_what_they_are(peaked_llama, features, tmp_path, monkeypatch):
    ahead = []  # per batch handed to a step: was the next one already asked for?
    real = Prefetcher.get
    monkeypatch.setattr(Prefetcher, "get", lambda self, key, rows, after=None: ahead.append(after is not None)
                        or real(self, key, rows, after))
    rows = {}
    for prefetch in (True, False):
        cfg = TrainConfig(draft_vocab_size=128, batch_size=4, max_steps=6, ttt_steps=2, eval_every=3, threads=1,
                          prefetch=prefetch)
        ahead.clear()
        train(cfg, peaked_llama, features, tmp_path / str(prefetch))
        assert ahead == ([True] * 5 + [False] if prefetch else [False] * 6)
        rows[prefetch] = [{k: v for k, v in r.items() if k != "elapsed_s"} for r in read_metrics(tmp_path / str(prefetch))]
    assert rows[True] == rows[False]


def test_bad_shard_found_mid_run_without_the_scan(peaked_llama, features, tmp_path, capsys):
    nan = tmp_path / "nan"
    shutil.copytree(features, nan)
    shard = nan / Manifest.load(nan).shards["train"][-1]["file"]
    with safe_open(str(shard), framework="pt") as f:
        meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    t["final_hidden"][-1, 0] = float("inf")  # the shard's last sequence
    save_file(t, str(shard), metadata=meta)
    last = json.loads(meta["seq_ids"])[-1]
    base = ["train", "--target", str(peaked_llama), "--data", str(nan), "--draft-vocab-size", "64",
            "--epochs", "1", "--batch-size", "8", "--eval-every", "0", "--threads", "1"]
    assert main([*base, "--out", str(tmp_path / "scanned")]) == 2
    assert not (tmp_path / "scanned").exists()  # the scan refuses it before anything is written
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "lazy"), "--scan-features", "false"]) == 2
    err = capsys.readouterr().err
    assert "NaN or inf in final_hidden" in err and last in err and shard.name in err


def test_prefetcher_loads_each_batch_once_and_ahead():
    calls, main = [], threading.get_ident()

    def load(rows):
        calls.append((tuple(rows), threading.get_ident() != main))
        if rows == [9]:
            raise LabError("bad batch")
        return sum(rows)

    p = Prefetcher(load)
    try:
        assert p.get("a", [1, 2], ("b", [3])) == 3
        assert p.get("b", [3], ("c", [4, 5])) == 3  # loaded ahead: no second load of [3]
        assert p.get("x", [7]) == 7  # not what was loaded ahead: loaded now, and nothing ahead
        with pytest.raises(LabError, match="bad batch"):  # a failed load surfaces where it is used
            p.get("y", [9])
    finally:
        p.close()
    assert [c[0] for c in calls] == [(1, 2), (3,), (4, 5), (7,), (9,)]
    assert all(in_worker for _, in_worker in calls)
