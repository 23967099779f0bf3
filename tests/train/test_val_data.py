"""`train --val-data`: validation on a set of its own (SpecForge's eval data) instead of the data's
val split, offline (a feature directory) and online (a conversations file, or features)."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from drafter_lab.atomic import sha256_file
from drafter_lab.cli import main
from drafter_lab.data.capture import prepare_features
from drafter_lab.data.shards import FeatureSet, Manifest
from drafter_lab.drafter.checkpoint import load_drafter
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics import evaluate
from drafter_lab.train.metrics_log import read_metrics

CFG = TrainConfig(draft_vocab_size=128, max_steps=6, batch_size=8, ttt_steps=3, lr=3e-3, warmup_steps=3,
                  log_every=1, eval_every=3, eval_batch_size=8, threads=1, max_length=96)
KEYS = ("loss_0", "loss_2", "acc_1", "cond_acc_0", "cond_acc_2", "simulated_accept_len")


def rows(out, split: str) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in read_metrics(out) if r["split"] == split]


def test_offline_run_validates_on_every_held_out_sequence(peaked_llama, features, held_out, tmp_path, capsys):
    _, val_dir = held_out
    plain = train(CFG, peaked_llama, features, tmp_path / "plain")
    final = train(CFG, peaked_llama, features, tmp_path / "held", val_data=val_dir)
    # Training itself is untouched: the same batches, metrics and weights.
    assert rows(tmp_path / "held", "train") == rows(tmp_path / "plain", "train")
    drafter = load_drafter(tmp_path / "held")
    assert all(torch.equal(a, b) for a, b in zip(drafter.state_dict().values(),
                                                 load_drafter(tmp_path / "plain").state_dict().values(), strict=True))
    # Each validation measured the held-out set, both of its splits.
    fs = FeatureSet(val_dir)
    refs = fs.index("train") + fs.index("val")
    assert fs.index("train") and fs.index("val")
    again = evaluate(drafter, load_target(peaked_llama, tokenizer=False).lm_head_weight(), refs, CFG.ttt_steps,
                     CFG.eval_batch_size, max_length=CFG.max_length)
    for k in KEYS:
        assert final[k] == pytest.approx(again[k], rel=1e-6, abs=1e-7), k
    assert final["loss_0"] != pytest.approx(plain["loss_0"], rel=1e-3)  # another set than the val split
    info = json.loads((tmp_path / "held" / "run.json").read_text())["features"]
    assert info["val_data"] == str(val_dir) and info["val_sequences"] == len(refs)
    assert info["val"] == {"manifest_sha256": sha256_file(val_dir / "manifest.json")}
    # The watch says so when a run and its baseline validate on different sets.
    capsys.readouterr()
    main(["watch", str(tmp_path / "held"), "--baseline", str(tmp_path / "plain"), "--json"])
    assert json.loads(capsys.readouterr().out)["note"] == (
        f"the runs validate on different sets ({val_dir} vs its data's val split): their metrics do not compare")
    train(CFG, peaked_llama, features, tmp_path / "watched", val_data=val_dir, stop_if_behind=tmp_path / "plain")
    assert "watch: the runs validate on different sets" in " ".join(capsys.readouterr().err.split())


def test_online_run_validates_on_a_conversations_file(peaked_llama, features, held_out, tmp_path):
    convs, val_dir = held_out
    train(CFG, peaked_llama, features, tmp_path / "off", val_data=val_dir)
    offline = rows(tmp_path / "off", "val")
    args = ["train", "--target", str(peaked_llama), "--conversations", Manifest.load(features).source["conversations"],
            "--val-fraction", "0.25", "--draft-vocab-size", "128", "--max-steps", "6", "--batch-size", "8",
            "--ttt-steps", "3", "--lr", "3e-3", "--warmup-steps", "3", "--log-every", "1", "--eval-every", "3",
            "--eval-batch-size", "8", "--threads", "1", "--max-length", "96"]
    assert main([*args, "--val-data", str(convs), "--out", str(tmp_path / "file")]) == 0
    assert main([*args, "--val-data", str(val_dir), "--out", str(tmp_path / "feats")]) == 0
    for run in ("file", "feats"):
        online = rows(tmp_path / run, "val")
        assert [r["step"] for r in online] == [r["step"] for r in offline] == [3, 4, 6]
        # Online states differ from the shards' only in low bits (capture padded other batches).
        for got, want in zip(online, offline, strict=True):
            for k in KEYS:
                assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-4), (run, k)
    info = json.loads((tmp_path / "file" / "run.json").read_text())["features"]
    off = json.loads((tmp_path / "off" / "run.json").read_text())["features"]
    assert info["val_data"] == str(convs) and info["val_sequences"] == off["val_sequences"] == 10
    assert info["val_skipped"] == {"no_loss_tokens_within_max_length": 2}  # as capture skipped them


def test_a_resume_needs_the_same_validation_set(peaked_llama, features, held_out, tmp_path):
    _, val_dir = held_out
    out = tmp_path / "run"
    final = train(CFG, peaked_llama, features, out, val_data=val_dir)
    with pytest.raises(LabError, match="--resume with other validation data"):  # the val split again
        train(CFG, peaked_llama, features, out, resume=True)
    with pytest.raises(LabError, match="--val-data is the --data path"):  # every sequence it trains on
        train(CFG, peaked_llama, features, out, resume=True, val_data=features)
    assert train(CFG, peaked_llama, features, out, resume=True, val_data=val_dir) == final


def test_bad_validation_data_is_one_line_and_writes_nothing(peaked_llama, features, held_out, tmp_path, capsys):
    convs, val_dir = held_out
    other_aux, other_target = tmp_path / "other_aux", tmp_path / "other_target"
    for copy, key, value in ((other_aux, "aux_layer_ids", [1, 4, 5]), (other_target, "target", None)):
        shutil.copytree(val_dir, copy)
        manifest = json.loads((copy / "manifest.json").read_text())
        manifest[key] = value if value is not None else {**manifest["target"], "fingerprint": "0123456789abcdef"}
        (copy / "manifest.json").write_text(json.dumps(manifest))
    no_answer = tmp_path / "no_answer.jsonl"
    no_answer.write_text(json.dumps({"id": "q", "conversations": [
        {"role": "user", "content": "x " * 200}, {"role": "assistant", "content": "y"}]}) + "\n")
    online = Manifest.load(features).source["conversations"]
    no_val = tmp_path / "no_val"  # captured with --val-fraction 0
    prepare_features(peaked_llama, convs, no_val, max_length=96, val_fraction=0.0, batch_size=16)
    capsys.readouterr()
    cases = [
        (features, convs, "validates on a feature directory, not a file"),
        (features, tmp_path / "missing", "feature directory not found"),
        (features, other_aux, r"validation features hold aux layers \[1, 4, 5\], the training data \[2, 4, 5\]"),
        (features, other_target, "features were captured from target 0123456789abcdef"),
        (online, no_answer, "no conversation keeps an assistant token within max_length=96"),
        (no_val, None, "no val sequences with loss tokens, nothing to validate on: .* or pass --val-data"),
        (online, None, r"no conversation falls in the val split \(--val-fraction 0.0\), nothing to validate on"),
    ]
    for data, val, message in cases:
        out = tmp_path / "out"
        how = ["--conversations" if data == online else "--data", str(data)]
        how += ["--val-data", str(val)] if val else ["--val-fraction", "0"] if data == online else []
        assert main(["train", "--target", str(peaked_llama), *how, "--out", str(out), "--max-length", "96",
                     "--threads", "1"]) == 2
        err = "\n".join(line for line in capsys.readouterr().err.strip().splitlines()
                        if not line.startswith("tokenize conversations"))  # progress, before the error
        assert len(err.splitlines()) == 1 and str(val or data) in err, err
        assert re.search(message, err), err
        assert not out.exists()
