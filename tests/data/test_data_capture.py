"""`data prepare` on a random HF Llama: stored states reproduce, resume is exact, bad input fails cleanly."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from data_helpers import PREPARE_ARGS, make_conversations, run_cli, write_jsonl

from drafter_lab.data.capture import split_of
from drafter_lab.data.chat import encode_conversation
from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.shards import FeatureSet, Manifest, stored_text
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import fingerprint, load_target, load_tokenizer

REPO = Path(__file__).resolve().parents[2]


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_manifest_describes_target_and_split(features, random_llama, conversations_file):
    m = Manifest.load(features)
    assert m.target["fingerprint"] == fingerprint(random_llama)
    assert m.target["architecture"] == "LlamaForCausalLM" and m.target["num_layers"] == 8
    assert m.aux_layer_ids == [2, 4, 5] and m.aux_convention == "hf_hidden_states"
    assert m.dtype == "float32"
    assert m.skipped["no_assistant_turn"] == 1
    assert m.source["sha256"] and m.source["max_length"] == 256
    convs, _ = read_conversations(conversations_file)
    kept = sum(m.counts(s)["sequences"] for s in ("train", "val"))
    assert kept + m.skipped.get("no_loss_tokens_within_max_length", 0) == len(convs) == 20
    for split in ("train", "val"):
        assert m.source["planned"][split]["sequences"] == m.counts(split)["sequences"]
        for seq in FeatureSet(features).sequences(split):
            assert split_of(seq.seq_id, 0.25) == split
    assert m.counts("val")["sequences"] > 0 and len(m.shards["train"]) > 1


def test_stored_states_reproduce_from_the_target(features, random_llama, conversations_file):
    target = load_target(random_llama)
    by_id = {c.id: c for c in read_conversations(conversations_file)[0]}
    fs = FeatureSet(features)
    lm_head = target.lm_head_weight()
    seqs = fs.sequences("train")[:4] + fs.sequences("val")[:2]
    assert len({len(s.input_ids) for s in seqs[:3]}) > 1  # captured in one right-padded batch
    for seq in seqs:
        ids, mask = encode_conversation(target.tokenizer, by_id[seq.seq_id].messages, 256)
        assert torch.equal(seq.input_ids, ids) and torch.equal(seq.loss_mask, mask)
        with torch.no_grad():
            out = target.model(ids[None], output_hidden_states=True)
        aux = torch.cat([out.hidden_states[i][0] for i in (2, 4, 5)], dim=-1)
        torch.testing.assert_close(seq.aux_hidden, aux, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(seq.final_hidden, out.hidden_states[-1][0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(seq.final_hidden @ lm_head.T, out.logits[0], rtol=1e-4, atol=1e-4)


def test_resume_recomputes_only_the_missing_shard(features, random_llama, conversations_file, tmp_path):
    out = tmp_path / "feat"
    shutil.copytree(features, out)
    before = snapshot(out)
    manifest = json.loads((out / "manifest.json").read_text())
    last = manifest["shards"]["train"].pop()
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / last["file"]).unlink()  # a run killed while it wrote its last shard:
    (out / f".{last['file']}.q8z1x0.tmp").write_bytes(b"half a shard")  # what SIGKILL leaves
    with pytest.raises(LabError, match="partial capture: train has"):
        FeatureSet(out).sequences("train")
    args = ("data", "prepare", "--target", random_llama, "--conversations", conversations_file, "--out", out)
    assert run_cli(*args, *PREPARE_ARGS) == 0
    assert snapshot(out) == before
    assert run_cli(*args, *PREPARE_ARGS) == 0  # nothing left to do: nothing changes
    assert snapshot(out) == before


def test_other_settings_are_refused(features, random_llama, conversations_file, tmp_path, capsys):
    out = tmp_path / "feat"
    shutil.copytree(features, out)
    before = snapshot(out)
    args = ("data", "prepare", "--target", random_llama, "--conversations", conversations_file, "--out", out)
    assert run_cli(*args, *PREPARE_ARGS, "--aux-layer-ids", "1,3,7") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "aux_layer_ids: [2, 4, 5] there, [1, 3, 7] now" in err
    assert snapshot(out) == before


def broken_config(root: Path, model: Path) -> Path:
    bad = root / "broken"
    shutil.copytree(model, bad)
    (bad / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": ')
    return bad


def nan_model(root: Path, model: Path) -> Path:
    from transformers import AutoModelForCausalLM

    bad = root / "nan"
    shutil.copytree(model, bad)
    m = AutoModelForCausalLM.from_pretrained(str(model))
    with torch.no_grad():
        m.model.layers[3].mlp.down_proj.weight[0, 0] = float("nan")
    m.save_pretrained(bad)
    return bad


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing model dir", "model directory not found"),
        ("corrupt model dir", "config.json: not valid JSON"),
        ("invalid JSON line", "line 2 is not valid JSON"),
        ("no assistant turn under --strict", "line 1: conversation has no assistant turn (--strict)"),
        ("aux ids out of range", "aux layer id(s) [9] out of range: hidden_states indices run 0..7"),
        ("aux id at the final norm", "aux layer id(s) [8] out of range: hidden_states indices run 0..7 (8 is the final norm's"),
        ("empty conversations file", "holds no conversations"),
        ("target computing NaN", "target produced NaN/inf hidden states on sequence"),
        ("tokenizer past the embedding", "the tokenizer's ids run to 513, past the model's 512-row embedding"),
    ],
)
def test_bad_input_one_line_exit_2_no_output(case, message, random_llama, tmp_path, capsys):
    good = json.dumps(make_conversations(1)[0])
    convs = write_jsonl(tmp_path / "c.jsonl", [good, good])
    target, extra = random_llama, []
    if case == "missing model dir":
        target = tmp_path / "no-such-model"
    elif case == "corrupt model dir":
        target = broken_config(tmp_path, random_llama)
    elif case == "invalid JSON line":
        convs = write_jsonl(tmp_path / "c.jsonl", [good, '{"conversations": [}', good])
    elif case == "no assistant turn under --strict":
        convs = write_jsonl(tmp_path / "c.jsonl", ['{"conversations": [{"from": "human", "value": "hi"}]}', good])
        extra = ["--strict"]
    elif case == "aux ids out of range":
        extra = ["--aux-layer-ids", "2,4,9"]
    elif case == "aux id at the final norm":
        extra = ["--aux-layer-ids", "2,4,8"]
    elif case == "empty conversations file":
        convs = write_jsonl(tmp_path / "c.jsonl", [])
    elif case == "tokenizer past the embedding":
        target = tmp_path / "grown"
        shutil.copytree(random_llama, target)
        tok = load_tokenizer(target)
        tok.add_special_tokens({"additional_special_tokens": ["[THINK]", "[/THINK]"]})
        tok.save_pretrained(target)
    else:
        target = nan_model(tmp_path, random_llama)
    out = tmp_path / "out"
    rc = run_cli("data", "prepare", "--target", target, "--conversations", convs, "--out", out, *extra)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1
    assert message in errors[0]
    assert str(convs if "line" in message or "conversation" in message else target) in errors[0]
    assert not out.exists()


@pytest.mark.parametrize("command", [("prepare", "--conversations"), ("import-specforge", "--hidden-states")])
def test_an_out_below_a_file_is_refused_before_any_work(tmp_path, capsys, command):
    """Not once every shard is computed: the target (none here) is not even loaded."""
    (tmp_path / "sf").mkdir()
    src = write_jsonl(tmp_path / "sf" / "c.jsonl", make_conversations(2))
    (tmp_path / "sf" / "a.ckpt").touch()
    (tmp_path / "f").touch()
    out = tmp_path / "f" / "sub" / "feat"
    name, given = command
    assert run_cli("data", name, given, src if name == "prepare" else src.parent, "--target", tmp_path / "no-such-target",
                   "--out", out) == 2
    err = capsys.readouterr().err
    assert err == f"error: {out}: --out lies below a file, not a directory\n"


def test_truncated_shard_is_an_error_when_reading(features, tmp_path, capsys):
    out = tmp_path / "feat"
    shutil.copytree(features, out)
    shard = out / "train-00001.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(LabError, match="truncated or corrupt feature shard") as e:
        FeatureSet(out).sequences("train")
    assert str(shard) in str(e.value)
    vocab = tmp_path / "v.safetensors"
    assert run_cli("vocab", "build", "--data", out, "--size", "32", "--out", vocab) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and str(shard) in err[-1] and "truncated" in err[-1]
    assert not vocab.exists()


def test_target_without_chat_template_uses_default(random_llama, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(random_llama, bare)
    (bare / "chat_template.jinja").unlink()
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(3))
    out = tmp_path / "feat"
    with pytest.warns(UserWarning, match="no chat template; using the default ChatML template"):
        rc = run_cli("data", "prepare", "--target", bare, "--conversations", convs, "--out", out,
                     "--max-length", "160", "--val-fraction", "0")
    assert rc == 0
    seqs = FeatureSet(out).sequences("train")
    assert len(seqs) == 3 and all(s.loss_mask.any() for s in seqs)


def test_entry_point_runs_as_a_module(tmp_path):
    """`python -m drafter_lab` is the same CLI: a bad target exits 2 with one error line."""
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(1))
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "drafter_lab", "data", "prepare", "--target", str(tmp_path / "nope"),
         "--conversations", str(convs), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {tmp_path / 'nope'}: model directory not found"]
    assert not (tmp_path / "out").exists()



def test_a_resume_computes_again_the_shards_that_encode_otherwise_now(features, random_llama, conversations_file,
                                                                       tmp_path, monkeypatch, capsys):
    """A capture resumed by another lab version whose encoding moved a loss mask (as the lab's fixes
    of end-of-turn tokens did): the shard holding it is computed again, the others kept, and the
    result equals a fresh capture with the new encoding; so is a shard that cannot be read."""
    from drafter_lab.data import capture

    out, fresh = tmp_path / "feat", tmp_path / "fresh"
    shutil.copytree(features, out)
    before = snapshot(out)
    moved = stored_text(out / "train-00001.safetensors")[0][-1]
    real = capture.encodings

    def fixed(seqs, *args):  # the "new version": the last loss token of one answer no longer trains
        for conv, e in zip(seqs, real(seqs, *args)):
            yield e._replace(mask=e.mask & (torch.arange(len(e.mask)) < e.mask.nonzero().max())) \
                if conv.id == moved else e

    monkeypatch.setattr(capture, "encodings", fixed)
    args = ("data", "prepare", "--target", random_llama, "--conversations", conversations_file, *PREPARE_ARGS)
    capsys.readouterr()
    assert run_cli(*args, "--out", out) == 0
    assert "1 of 5 shards written hold other sequences, tokens or loss masks" in " ".join(capsys.readouterr().err.split())
    after = snapshot(out)
    assert {k for k in before if before[k] != after[k]} == {"train-00001.safetensors", "manifest.json"}
    assert run_cli(*args, "--out", fresh) == 0
    assert snapshot(fresh) == after
    capsys.readouterr()
    assert run_cli(*args, "--out", out) == 0  # as planned now: nothing to do
    assert snapshot(out) == after and "shards written" not in capsys.readouterr().err

    monkeypatch.setattr(capture, "encodings", real)
    (out / "val-00000.safetensors").write_bytes(b"not a shard")
    assert run_cli(*args, "--out", out) == 0
    assert "2 of 5 shards written" in " ".join(capsys.readouterr().err.split())
    assert snapshot(out) == before


@pytest.mark.parametrize("change", ["none", "id", "token", "loss mask", "lengths", "unreadable"])
def test_a_shard_holds_its_plan_only_as_written(features, tmp_path, change):
    from drafter_lab.data.capture import _holds_as_planned

    shard = tmp_path / "s.safetensors"
    shutil.copy(features / "train-00000.safetensors", shard)
    seq_ids, ids, mask, offsets = stored_text(shard)
    chunk = [[i, ids[a:b].long().clone(), mask[a:b].bool().clone()]
             for i, a, b in zip(seq_ids, offsets.tolist(), offsets[1:].tolist())]
    if change == "id":
        chunk[1][0] += "'"
    elif change == "token":
        chunk[2][1][-1] += 1
    elif change == "loss mask":
        chunk[0][2][0] ^= True
    elif change == "lengths":  # the same tokens, cut elsewhere
        chunk[0][1], chunk[1][1] = chunk[0][1][:-1], torch.cat([chunk[0][1][-1:], chunk[1][1]])
        chunk[0][2], chunk[1][2] = chunk[0][2][:-1], torch.cat([chunk[0][2][-1:], chunk[1][2]])
    elif change == "unreadable":
        shard.write_bytes(shard.read_bytes()[:100])
    assert _holds_as_planned(shard, [tuple(it) for it in chunk]) == (change == "none")


def test_a_resume_that_would_plan_other_sequences_is_refused(features, random_llama, conversations_file, tmp_path,
                                                              monkeypatch, capsys):
    """Another lab version that keeps a sequence the first one skipped (or the reverse) moves every
    shard after it: refused in one line, naming the counts, and nothing is written."""
    from drafter_lab.data import capture

    out = tmp_path / "feat"
    shutil.copytree(features, out)
    before = snapshot(out)
    real = capture.encodings

    def trains_nothing_of_one(seqs, *args):
        for k, e in enumerate(real(seqs, *args)):
            yield e._replace(mask=torch.zeros_like(e.mask)) if k == 0 else e

    monkeypatch.setattr(capture, "encodings", trains_nothing_of_one)
    capsys.readouterr()
    assert run_cli("data", "prepare", "--target", random_llama, "--conversations", conversations_file, "--out", out,
                   *PREPARE_ARGS) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and str(out / "manifest.json") in err and "but this run plans" in err
    assert "the same input now makes other sequences" in err and snapshot(out) == before


def test_a_capture_named_by_the_legacy_fingerprint_resumes_and_trains_under_it(features, random_llama,
                                                                              conversations_file, tmp_path):
    """Work begun before targets were fingerprinted by a sample of every tensor records the older name: it
    resumes (under that name, not refused as another target's) and its features train."""
    from drafter_lab.targets.fingerprint import legacy_fingerprint
    from drafter_lab.targets.hf import load_target_head

    out = tmp_path / "feat"
    shutil.copytree(features, out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["target"]["fingerprint"] = legacy = legacy_fingerprint(random_llama)
    last = manifest["shards"]["train"].pop()
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / last["file"]).unlink()
    args = ("data", "prepare", "--target", random_llama, "--conversations", conversations_file, "--out", out)
    assert run_cli(*args, *PREPARE_ARGS) == 0
    assert Manifest.load(out).target["fingerprint"] == legacy != fingerprint(random_llama)
    assert (out / last["file"]).read_bytes() == (features / last["file"]).read_bytes()
    FeatureSet(out).check_target(load_target_head(random_llama))
    manifest["target"]["fingerprint"] = "0123456789abcdef"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(LabError, match="features were captured from target 0123456789abcdef"):
        FeatureSet(out).check_target(load_target_head(random_llama))


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -1.0])
def test_a_regeneration_temperature_that_is_no_finite_number_is_one_line(temperature):
    from drafter_lab.data.capture import CaptureConfig, check_config

    with pytest.raises(LabError, match="temperature must be a finite number >= 0"):
        check_config(CaptureConfig(temperature=temperature))


def test_tensor_parallel_capture_on_a_rank_count_that_does_not_divide_the_heads_is_one_line(random_llama,
                                                                                            monkeypatch):
    from drafter_lab.data.capture import _load_tp_target

    monkeypatch.setenv("WORLD_SIZE", "3")  # 4 heads, 2 key/value heads
    with pytest.raises(LabError, match="3 ranks do not divide the target's 4 attention heads and 2 key/value heads"):
        _load_tp_target(random_llama, None)
