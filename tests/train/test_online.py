"""Online training: the target computes each batch's states inside `train`. Its sequences, split,
vocab and states are the captured ones, and a run trains like one on `data prepare`'s shards."""

from __future__ import annotations

import dataclasses
import gzip
import json

import pytest
import torch

from drafter_lab.atomic import sha256_file
from drafter_lab.cli import main
from drafter_lab.data.capture import CaptureConfig, conversation_of, split_of
from drafter_lab.data.chat import template_sha256, tokenizer_sha256
from drafter_lab.data.shards import FeatureSet, Manifest
from drafter_lab.data.vocab import count_train_tokens
from drafter_lab.drafter.checkpoint import load_drafter
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_tokenizer
from drafter_lab.train import loop as loop_module
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.sources import Online

# As the `features` fixture was captured.
CAPTURE = CaptureConfig(max_length=96, val_fraction=0.25)
CFG = TrainConfig(draft_vocab_size=128, max_steps=6, batch_size=8, ttt_steps=3, lr=3e-3, warmup_steps=3,
                  log_every=1, eval_every=3, eval_batch_size=8, threads=1, max_length=96)


def conversations_of(features):
    return Manifest.load(features).source["conversations"]


def test_online_states_are_the_captured_ones(peaked_llama, features):
    online = Online(peaked_llama, conversations_of(features), CAPTURE, torch.device("cpu"))
    fs = FeatureSet(features)
    assert online.aux_layer_ids == fs.manifest.aux_layer_ids
    assert torch.equal(online.token_counts(), count_train_tokens(features))
    for split in ("train", "val"):
        assert [p.seq_id for p in online.items[split]] == [r.seq_id for r in fs.require(split)]
    prompts, refs = online.items["train"][18:24], fs.require("train")[18:24]
    assert len({len(p) for p in prompts}) > 1  # one right-padded forward, as capture batches
    for got, want in zip(online.read(prompts), fs.read(refs), strict=True):
        assert got.seq_id == want.seq_id and torch.equal(got.input_ids, want.input_ids)
        assert torch.equal(got.loss_mask, want.loss_mask)
        torch.testing.assert_close(got.aux_hidden, want.aux_hidden, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.final_hidden, want.final_hidden, rtol=1e-5, atol=1e-5)


def test_online_identity_names_the_chat_template_variables(peaked_llama, features):
    """A resume must see the same template variables (`--chat-template-kwargs`); runs without any keep
    the identity they had."""
    cpu, convs = torch.device("cpu"), conversations_of(features)
    assert "chat_template_kwargs" not in Online(peaked_llama, convs, CAPTURE, cpu).identity()
    off = dataclasses.replace(CAPTURE, chat_template_kwargs={"enable_thinking": False})
    assert Online(peaked_llama, convs, off, cpu).identity()["chat_template_kwargs"] == {"enable_thinking": False}


def test_online_identity_follows_a_gzip_files_conversations_not_its_compression(peaked_llama, features, tmp_path):
    """A run on a gzip'd conversations file resumes on the same conversations compressed otherwise
    (another level or tool, or not at all); a plain file keeps the key it always had."""
    cpu, plain = torch.device("cpu"), conversations_of(features)
    keys = set()
    for level in (1, 9):
        packed = tmp_path / f"c{level}.jsonl.gz"
        packed.write_bytes(gzip.compress(open(plain, "rb").read(), compresslevel=level))
        keys.add(Online(peaked_llama, packed, CAPTURE, cpu).identity()["sha256"])
    assert keys == {Online(peaked_llama, plain, CAPTURE, cpu).identity()["sha256"]} == {sha256_file(plain)}


def test_online_each_turn_is_a_sequence_in_its_conversations_split(peaked_llama, features):
    """`--turns each` online: a sequence per assistant turn, in its conversation's split, named in the
    identity (a run without it keeps the identity it had)."""
    cpu, convs = torch.device("cpu"), conversations_of(features)
    every, one = (Online(peaked_llama, convs, dataclasses.replace(CAPTURE, turns=t), cpu) for t in ("each", "all"))
    assert every.identity()["turns"] == "each" and "turns" not in one.identity()
    whole = {s: {p.seq_id for p in one.items[s]} for s in ("train", "val")}
    for split in ("train", "val"):
        ids = [p.seq_id for p in every.items[split]]
        assert ids and all("#turn" in i for i in ids)
        assert {conversation_of(i) for i in ids} == whole[split]


@pytest.mark.parametrize("unseen, begun", [
    (("chat_template_sha256", "tokenizer_sha256"), "begun before the lab recorded chat templates and tokenizers"),
    (("tokenizer_sha256",), "begun before the lab recorded tokenizers, so its tokenizer is not checked"),
])
def test_an_online_run_resumes_only_as_it_rendered(peaked_llama, features, tmp_path, monkeypatch, capsys, unseen,
                                                   begun):
    """Text rendered with an edited template, or tokenized by another tokenizer, is other training
    data; a run begun before the lab recorded them resumes unchecked."""
    from drafter_lab.train import sources

    cfg, online, convs = dataclasses.replace(CFG, max_steps=2, eval_every=2), CAPTURE, conversations_of(features)
    train(cfg, peaked_llama, convs, tmp_path / "now", online=online)
    recorded = json.loads((tmp_path / "now" / "run.json").read_text())["features"]
    assert recorded["chat_template_sha256"] == template_sha256(load_tokenizer(peaked_llama))
    assert recorded["tokenizer_sha256"] == tokenizer_sha256(load_tokenizer(peaked_llama))
    real = sources.Online.identity
    monkeypatch.setattr(sources.Online, "identity",
                        lambda self: {k: v for k, v in real(self).items() if k not in unseen})
    train(cfg, peaked_llama, convs, tmp_path / "before", online=online)
    monkeypatch.setattr(sources.Online, "identity", real)
    capsys.readouterr()
    train(cfg, peaked_llama, convs, tmp_path / "before", online=online, resume=True)
    assert begun in " ".join(capsys.readouterr().err.split())
    made = sources.rendered_with
    monkeypatch.setattr(sources, "rendered_with", lambda tok, kwargs: {**made(tok, kwargs), unseen[0]: "edited"})
    with pytest.raises(LabError, match="--resume with other training data"):
        train(cfg, peaked_llama, convs, tmp_path / "now", online=online, resume=True)


@pytest.mark.parametrize("split", ["train", "val"])
def test_an_online_run_resumes_only_on_what_its_conversations_encoded_to(peaked_llama, features, tmp_path,
                                                                         monkeypatch, capsys, split):
    """Another lab or transformers version can encode the same conversations otherwise: its resume of
    a run is refused, in one line, rather than trained on the other encoding; a run begun before the
    lab recorded encodings resumes unchecked."""
    from drafter_lab.train import sources

    cfg, online, convs = dataclasses.replace(CFG, max_steps=2, eval_every=2), CAPTURE, conversations_of(features)
    train(cfg, peaked_llama, convs, tmp_path / "run", online=online)
    real = sources.tokenize_conversations

    def other_masks(*args):  # the first loss token of one conversation in `split` no longer trains
        items = real(*args)
        k = next(k for k, it in enumerate(items) if split_of(it[0], CAPTURE.val_fraction) == split)
        seq_id, ids, mask = items[k]
        return [*items[:k], (seq_id, ids, mask & (torch.arange(len(mask)) > mask.nonzero().min())), *items[k + 1:]]

    monkeypatch.setattr(sources, "tokenize_conversations", other_masks)
    with pytest.raises(LabError, match="the same conversations now encode to other tokens or loss masks") as e:
        train(cfg, peaked_llama, convs, tmp_path / "run", online=online, resume=True)
    assert str(tmp_path / "run") in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setattr(sources, "tokenize_conversations", real)

    identity = sources.Online.identity
    monkeypatch.setattr(sources.Online, "identity", lambda self: {k: v for k, v in identity(self).items()
                                                                  if k != "encoded_sha256"})
    train(cfg, peaked_llama, convs, tmp_path / "before", online=online)
    monkeypatch.setattr(sources.Online, "identity", identity)
    monkeypatch.setattr(sources, "tokenize_conversations", other_masks)
    capsys.readouterr()
    train(cfg, peaked_llama, convs, tmp_path / "before", online=online, resume=True)
    assert "begun before the lab recorded encodings, so its encoding is not checked" in \
        " ".join(capsys.readouterr().err.split())


def test_online_run_trains_as_on_captured_features(peaked_llama, features, tmp_path):
    offline = train(CFG, peaked_llama, features, tmp_path / "offline")
    convs = conversations_of(features)
    args = ["train", "--target", str(peaked_llama), "--conversations", convs, "--val-fraction", "0.25",
            "--draft-vocab-size", "128", "--max-steps", "6", "--batch-size", "8", "--ttt-steps", "3", "--lr", "3e-3",
            "--warmup-steps", "3", "--log-every", "1", "--eval-every", "3", "--eval-batch-size", "8",
            "--threads", "1", "--max-length", "96"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    rows = [[{k: v for k, v in json.loads(line).items() if k != "elapsed_s"}
             for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()] for run in ("a", "b")]
    assert rows[0] == rows[1]  # deterministic, though the target runs in the loader's thread
    online = rows[0][-1]
    assert online["step"] == offline["step"] == 6
    # The states differ from the shards' only in low bits (capture padded other batches).
    for k in ("loss_0", "loss_2", "cond_acc_0", "acc_2", "simulated_accept_len"):
        assert online[k] == pytest.approx(offline[k], rel=1e-4, abs=1e-4), k
    assert torch.equal(load_drafter(tmp_path / "a").d2t, load_drafter(tmp_path / "offline").d2t)
    run = json.loads((tmp_path / "a" / "run.json").read_text())
    assert run["features"]["online"] == convs and run["features"]["aux_layer_ids"] == [2, 4, 5]


def test_validation_states_are_kept_and_change_nothing(peaked_llama, features, tmp_path, monkeypatch):
    """Validated at steps 0, 3 and 6 (and at the epoch's end): kept, the val set runs through the
    target once, not at every validation, and every metric is identical to a run that recomputes it."""
    from drafter_lab.train import sources

    forwards = []
    real = sources.capture_states
    monkeypatch.setattr(sources, "capture_states", lambda target, items, *a: (forwards.append(
        [it[0] for it in items]), real(target, items, *a))[1])
    convs, cfg = conversations_of(features), dataclasses.replace(CFG, eval_at_start=True)
    val_ids = {p.seq_id for p in Online(peaked_llama, convs, CAPTURE, torch.device("cpu")).items["val"]}
    metrics = {}
    for mb in (0, 64):
        forwards.clear()
        train(dataclasses.replace(cfg, online_val_cache_mb=mb), peaked_llama, convs, tmp_path / str(mb),
              online=CAPTURE)
        metrics[mb] = [{k: v for k, v in json.loads(line).items() if k != "elapsed_s"}
                       for line in (tmp_path / str(mb) / "metrics.jsonl").read_text().splitlines()]
        validations = sum(row["split"] == "val" for row in metrics[mb])
        val_reads = sum(len(ids) for ids in forwards if set(ids) <= val_ids)
        assert validations >= 3 and val_reads == len(val_ids) * (validations if mb == 0 else 1), mb
    assert metrics[0] == metrics[64]


def test_online_bad_input(peaked_llama, features, tmp_path, capsys):
    convs = conversations_of(features)
    with pytest.raises(LabError, match="online training does not regenerate"):
        train(CFG, peaked_llama, convs, tmp_path / "x", online=CaptureConfig(regenerate=True))
    with pytest.raises(LabError, match=r"aux layer id\(s\) \[9\] out of range"):
        train(CFG, peaked_llama, convs, tmp_path / "x", online=CaptureConfig(aux_layer_ids=[2, 4, 9]))
    assert main(["train", "--target", str(peaked_llama), "--data", str(features), "--out", str(tmp_path / "x"),
                 "--target-dtype", "bfloat16"]) == 2
    assert "--target-dtype applies to --conversations (online) runs only" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_online_tokenize_workers_and_turns_reach_the_capture(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(loop_module, "train", lambda *args, online=None, **kw: seen.append(online) or {"step": 1})
    assert main(["train", "--target", str(tmp_path), "--conversations", str(tmp_path / "c.jsonl"),
                 "--out", str(tmp_path / "o"), "--tokenize-workers", "3", "--turns", "each"]) == 0
    assert (seen[0].tokenize_workers, seen[0].turns) == (3, "each")


@pytest.fixture(scope="module")
def sampled_answers(peaked_llama, features, tmp_path_factory):
    """The `features` conversations with every answer the target's own, sampled at 0.8 (`data
    regenerate`: each answer carries its token_ids and temperature)."""
    root = tmp_path_factory.mktemp("sampled_answers")
    assert main(["data", "regenerate", "--target", str(peaked_llama), "--conversations", conversations_of(features),
                 "--out", str(root / "sampled.jsonl"), "--temperature", "0.8", "--max-new-tokens", "48",
                 "--seed", "1"]) == 0
    return root / "sampled.jsonl"


def test_online_token_exact_replays_as_on_captured_features(peaked_llama, sampled_answers, tmp_path, capsys):
    """`train --conversations F --token-exact` tokenizes as `data prepare --token-exact` does, so its
    validation replays the sampled server over the val split as a run on those features does."""
    feats = tmp_path / "feats"
    assert main(["data", "prepare", "--target", str(peaked_llama), "--conversations", str(sampled_answers),
                 "--out", str(feats), "--max-length", "96", "--val-fraction", "0.25", "--batch-size", "16",
                 "--token-exact"]) == 0
    cfg = dataclasses.replace(CFG, val_temperature=0.8, keep_best="replay_accept_len")
    offline = train(cfg, peaked_llama, feats, tmp_path / "offline")
    assert main(["train", "--target", str(peaked_llama), "--conversations", str(sampled_answers), "--token-exact",
                 "--val-fraction", "0.25", "--draft-vocab-size", "128", "--max-steps", "6", "--batch-size", "8",
                 "--ttt-steps", "3", "--lr", "3e-3", "--warmup-steps", "3", "--log-every", "1", "--eval-every", "3",
                 "--eval-batch-size", "8", "--threads", "1", "--max-length", "96", "--val-temperature", "0.8",
                 "--keep-best", "replay_accept_len", "--out", str(tmp_path / "online")]) == 0
    online = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    replay = [f"replay_accept_len_{k}" for k in range(CFG.ttt_steps)]
    for k in ("loss_0", "acc_2", "sampled_accept_len", *replay):
        assert online[k] == pytest.approx(offline[k], rel=1e-4, abs=1e-4), k
    assert 1 < online["replay_accept_len_0"] < online["replay_accept_len_2"]
    run = json.loads((tmp_path / "online" / "run.json").read_text())
    assert run["features"]["token_exact"] is True
    # Held-out features say themselves how they were captured, whatever the training text is.
    assert Online(peaked_llama, sampled_answers, CAPTURE, torch.device("cpu"), val_data=feats).val_sampled_at == 0.8
    # Re-tokenized, the same answers are not the target's own tokens: no replay, and no resume either.
    plain = train(dataclasses.replace(cfg, keep_best=""), peaked_llama, sampled_answers, tmp_path / "plain",
                  online=dataclasses.replace(CAPTURE, val_fraction=0.25))
    assert "sampled_accept_len" in plain and not any(k.startswith("replay") for k in plain)
    assert "the validation text is not the target's own tokens" in " ".join(capsys.readouterr().err.split())
    with pytest.raises(LabError, match="--resume with other training data"):
        train(dataclasses.replace(cfg, keep_best=""), peaked_llama, sampled_answers, tmp_path / "plain", resume=True,
              online=dataclasses.replace(CAPTURE, val_fraction=0.25, token_exact=True))


def test_online_token_exact_validation_sets(peaked_llama, sampled_answers, tmp_path):
    """A held-out conversations file replays when every answer in it was sampled at one temperature."""
    exact = dataclasses.replace(CAPTURE, token_exact=True)
    cpu = torch.device("cpu")
    assert Online(peaked_llama, sampled_answers, exact, cpu).val_sampled_at == 0.8
    assert Online(peaked_llama, sampled_answers, dataclasses.replace(exact, turns="each"), cpu).val_sampled_at == 0.8
    assert Online(peaked_llama, sampled_answers, exact, cpu, val_data=sampled_answers).val_sampled_at == 0.8
    assert Online(peaked_llama, sampled_answers, CAPTURE, cpu, val_data=sampled_answers).val_sampled_at is None
    lines = sampled_answers.read_text().splitlines()
    one = json.loads(lines[0])
    next(m for m in one["conversations"] if m["role"] == "assistant")["temperature"] = 0.5
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join([json.dumps(one), *lines[1:]]) + "\n")
    assert Online(peaked_llama, sampled_answers, exact, cpu, val_data=mixed).val_sampled_at is None
    # Answers another target sampled are not this target's own tokens.
    next(m for m in one["conversations"] if m["role"] == "assistant")["target_fingerprint"] = "0123456789abcdef"
    mixed.write_text("\n".join([json.dumps(one), *lines[1:]]) + "\n")
    with pytest.raises(LabError, match=f"conversation {one['id']}: answers sampled by target 0123456789abcdef"):
        Online(peaked_llama, sampled_answers, exact, cpu, val_data=mixed)


def test_online_token_exact_needs_the_ids(peaked_llama, features, tmp_path, capsys):
    convs = conversations_of(features)
    with pytest.raises(LabError, match="has no token_ids") as e:
        train(CFG, peaked_llama, convs, tmp_path / "x", online=dataclasses.replace(CAPTURE, token_exact=True))
    assert str(convs) in str(e.value)
    assert main(["train", "--target", str(peaked_llama), "--data", str(features), "--out", str(tmp_path / "x"),
                 "--token-exact"]) == 2
    said = "error: --token-exact applies to --conversations (online) runs only"
    assert said in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
