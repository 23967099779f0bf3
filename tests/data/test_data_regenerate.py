"""Regeneration: the assistant turns become the target's own continuations, and a killed run resumes."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from data_helpers import make_conversations, run_cli, write_jsonl
from test_data_capture import snapshot

from drafter_lab.data.capture import sampled_at
from drafter_lab.data.chat import render
from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.regenerate import regenerate
from drafter_lab.data.shards import FeatureSet, Manifest
from drafter_lab.targets.fingerprint import fingerprint, legacy_fingerprint
from drafter_lab.targets.hf import load_target, stop_token_ids

NEW_TOKENS = 6


def greedy_reference(target, messages, upto: int, new_tokens: int = NEW_TOKENS) -> tuple[str, list[int]]:
    """Token-by-token argmax with full recomputation: no padding, no KV cache, no `generate`; the
    answer's text and token ids."""
    tok = target.tokenizer
    ids = tok(render(tok, messages[:upto], add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    ids, new = torch.tensor([ids]), []
    stops = set(stop_token_ids(target))
    for _ in range(new_tokens):
        with torch.no_grad():
            nxt = int(target.model(ids).logits[0, -1].argmax())
        if nxt in stops:
            break
        new.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return tok.decode(new, skip_special_tokens=True), new


def test_greedy_regeneration_is_the_targets_own_and_deterministic(random_llama, tmp_path):
    target = load_target(random_llama)
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", make_conversations(3)))
    out = regenerate(target, convs, max_new_tokens=NEW_TOKENS, batch_size=2)
    again = regenerate(target, convs, max_new_tokens=NEW_TOKENS, batch_size=2)
    assert [c.messages for c in out] == [c.messages for c in again]
    for old, new in zip(convs, out):
        assert new.id == old.id
        for i, (a, b) in enumerate(zip(old.messages, new.messages)):
            assert a["role"] == b["role"]
            if a["role"] != "assistant":
                assert a == b
            else:  # turn 2 is generated after the target's own turn 1, as in a real chat
                assert b["content"] != a["content"]
                assert (b["content"], b["token_ids"]) == greedy_reference(target, new.messages, i)


def test_the_models_own_generation_config_reshapes_nothing(random_llama, tmp_path):
    """A generation_config.json that would truncate and penalise (as Qwen2.5's does, only harder), search
    with beams, or ban and suppress tokens: greedy answers stay the plain argmax, and sampling at T = 1
    still draws tokens outside its top-1."""
    model = tmp_path / "opinionated"
    shutil.copytree(random_llama, model)
    (model / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "temperature": 0.05, "top_k": 1, "top_p": 0.05, "min_p": 0.9, "typical_p": 0.05,
        "repetition_penalty": 50.0, "no_repeat_ngram_size": 1, "eos_token_id": 2, "num_beams": 3,
        "bad_words_ids": [[i] for i in range(300, 320)], "suppress_tokens": list(range(3, 300))}))
    target = load_target(model)
    assert target.model.generation_config.top_k == 1  # the file is read
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", make_conversations(3)))
    greedy = regenerate(target, convs, max_new_tokens=12, batch_size=2)
    repeats = 0
    for conv in greedy:
        for i, m in enumerate(conv.messages):
            if m["role"] == "assistant":
                assert (m["content"], m["token_ids"]) == greedy_reference(target, conv.messages, i, 12)
                repeats += len(m["token_ids"]) - len(set(m["token_ids"]))
    assert repeats > 0  # the argmax repeats itself: a repetition penalty would have changed it
    sampled = regenerate(target, convs, temperature=1.0, max_new_tokens=12, batch_size=2, seed=3)
    tokens = [t for c in sampled for m in c.messages if m["role"] == "assistant" for t in m["token_ids"]]
    argmax = [t for c in greedy for m in c.messages if m["role"] == "assistant" for t in m["token_ids"]]
    assert tokens != argmax and len(set(tokens)) > len(tokens) // 2


def test_sampling_follows_the_seed(random_llama, tmp_path):
    target = load_target(random_llama)
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", make_conversations(2)))
    kw = dict(temperature=1.0, max_new_tokens=NEW_TOKENS, batch_size=2)
    a = regenerate(target, convs, seed=1, **kw)
    b = regenerate(target, convs, seed=1, **kw)
    c = regenerate(target, convs, seed=2, **kw)
    assert [x.messages for x in a] == [x.messages for x in b]
    assert [x.messages for x in a] != [x.messages for x in c]


def test_prepare_with_regenerate_captures_the_generations(random_llama, tmp_path):
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(3))
    out = tmp_path / "feat"
    args = ("data", "prepare", "--target", random_llama, "--conversations", convs, "--out", out,
            "--regenerate", "--max-new-tokens", NEW_TOKENS, "--val-fraction", "0")
    assert run_cli(*args) == 0
    cache = list(out.glob("regenerated-*.jsonl"))
    assert len(cache) == 1
    regenerated = {c.id: c for c in read_conversations(cache[0])[0]}
    target = load_target(random_llama)
    for seq in FeatureSet(out).sequences("train"):
        answers = [m for m in regenerated[seq.seq_id].messages if m["role"] == "assistant"]
        masked = target.tokenizer.decode(seq.input_ids[seq.loss_mask])
        # The end token trains after an answer the target stopped, not after one cut at --max-new-tokens.
        assert masked == "".join(m["content"] + "<|im_end|>" * (m["finish_reason"] == "stop") for m in answers)


def test_token_exact_capture_holds_the_tokens_the_target_sampled(random_llama, tmp_path, capsys):
    """Each answer's loss tokens are the ids the target sampled (then the template's end token, where
    the target stopped the answer), and everything before the first answer is its prompt as a server
    tokenizes it."""
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(4))
    out = tmp_path / "feat"
    args = ("data", "prepare", "--target", random_llama, "--conversations", convs, "--out", out, "--regenerate",
            "--val-fraction", "0", "--temperature", "1.0", "--max-new-tokens", "12", "--seed", "5")
    assert run_cli(*args, "--token-exact") == 0
    (cache,) = out.glob("regenerated-*.jsonl")
    regenerated = {c.id: c.messages for c in read_conversations(cache)[0]}
    tok = load_target(random_llama).tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    retokenized = 0
    for seq in FeatureSet(out).sequences("train"):
        messages = regenerated[seq.seq_id]
        turns = [m for m in messages if m["role"] == "assistant"]
        answers = [m["token_ids"] for m in turns]
        assert seq.input_ids[seq.loss_mask].tolist() == \
            [t for m in turns for t in [*m["token_ids"], *[end] * (m["finish_reason"] == "stop")]]
        first = int(seq.loss_mask.int().argmax())
        prompt = render(tok, messages[:messages.index(next(m for m in messages if m["role"] == "assistant"))],
                        add_generation_prompt=True)
        assert seq.input_ids[:first].tolist() == tok(prompt, add_special_tokens=False)["input_ids"]
        retokenized += sum(tok(tok.decode(ids), add_special_tokens=False)["input_ids"] != ids for ids in answers)
    assert retokenized > 0  # the text of some answers tokenizes otherwise: the test tells the two apart
    assert FeatureSet(out).manifest.source["token_exact"] is True
    assert run_cli(*args, "--out", tmp_path / "other") == 0  # without the flag: the text, tokenized again
    assert "token_exact" not in FeatureSet(tmp_path / "other").manifest.source
    assert sampled_at(FeatureSet(out).manifest.source) == 1.0
    # The same answers regenerated first (`data regenerate`), then captured token for token.
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "r.jsonl", "--target",
                   random_llama, "--temperature", "1.0", "--max-new-tokens", "12", "--seed", "5") == 0
    assert run_cli(*args[:4], "--conversations", tmp_path / "r.jsonl", "--out", tmp_path / "given", "--val-fraction", "0",
                   "--token-exact") == 0
    given = FeatureSet(tmp_path / "given")
    assert [(s.input_ids.tolist(), s.loss_mask.tolist()) for s in given.sequences("train")] == \
        [(s.input_ids.tolist(), s.loss_mask.tolist()) for s in FeatureSet(out).sequences("train")]
    assert given.manifest.source["sampled_at"] == 1.0 and sampled_at(given.manifest.source) == 1.0
    # Answers sampled at two temperatures are the target's tokens, but at no one temperature.
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    rows[0]["conversations"][-1]["temperature"] = 0.5
    mixed = write_jsonl(tmp_path / "mixed.jsonl", rows)
    assert run_cli(*args[:4], "--conversations", mixed, "--out", tmp_path / "mixed", "--val-fraction", "0",
                   "--token-exact") == 0
    assert sampled_at(FeatureSet(tmp_path / "mixed").manifest.source) is None
    # Each answer names the target that sampled it; another target's tokens are refused, their text is not.
    mine = fingerprint(random_llama)
    assert {m["target_fingerprint"] for r in rows for m in r["conversations"] if m["role"] == "assistant"} == {mine}
    rows[1]["conversations"][-1]["target_fingerprint"] = "0123456789abcdef"
    other = write_jsonl(tmp_path / "other.jsonl", rows)
    capsys.readouterr()
    assert run_cli(*args[:4], "--conversations", other, "--out", tmp_path / "o", "--token-exact") == 2
    err = capsys.readouterr().err
    assert f"{other}: conversation {rows[1]['id']}: answers sampled by target 0123456789abcdef, not by this one " \
        f"({mine})" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()
    assert run_cli(*args[:4], "--conversations", other, "--out", tmp_path / "o", "--val-fraction", "0") == 0
    assert f"{other}: 1 of {len(rows)} conversations hold answers target(s) 0123456789abcdef sampled, not this " \
        f"one ({mine}): they train as text" in " ".join(capsys.readouterr().err.split())
    assert run_cli(*args[:4], "--conversations", tmp_path / "r.jsonl", "--out", tmp_path / "r") == 0
    assert "hold answers" not in capsys.readouterr().err  # the target's own
    # Answers without ids cannot be captured token for token: one line, nothing written.
    capsys.readouterr()
    assert run_cli(*args[:6], "--out", tmp_path / "bad", "--token-exact") == 2
    err = capsys.readouterr().err
    assert f"{convs}: conversation " in err and "has no token_ids" in err and err.count("\n") == 1
    assert not (tmp_path / "bad").exists()


SAMPLED = ("--temperature", "1.0", "--max-new-tokens", NEW_TOKENS, "--seed", "3")


def test_a_killed_regeneration_resumes_from_its_journal(random_llama, tmp_path, interrupt_at, capsys):
    """6 conversations x 2 turns in batches of 2 is 6 batches. Stopped in the 4th (round 2, so turn 1
    comes back from the journal), with half a line after the last record; resumed, it generates the
    3 batches left and, sampling included, writes the uninterrupted run's bytes."""
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(6))
    args = ("data", "regenerate", "--conversations", convs, "--target", random_llama, "--batch-size", "2", *SAMPLED)
    assert run_cli(*args, "--out", tmp_path / "whole.jsonl") == 0
    out, partial = tmp_path / "resumed.jsonl", tmp_path / "resumed.jsonl.partial"
    interrupt_at(4)
    assert run_cli(*args, "--out", out) == 130
    assert not out.exists() and len(partial.read_text().splitlines()) == 1 + 3  # settings + 3 batches
    with open(partial, "a") as f:
        f.write('{"round": 1, "answ')
    assert run_cli(*args[:-1], "4", "--out", out) == 2  # another seed: refused, naming the journal
    assert f"{partial}: partial run made with other settings" in capsys.readouterr().err
    calls = interrupt_at(None)
    assert run_cli(*args, "--out", out) == 0
    assert len(calls) == 3
    assert out.read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    assert not partial.exists()


def test_a_sampled_run_resumes_on_the_device_it_began_on(random_llama, tmp_path, interrupt_at, capsys):
    """Its RNG state is that device's: resumed on another, the rest would be neither run's answers (CPU to
    CUDA was a KeyError)."""
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(4))
    out, partial = tmp_path / "r.jsonl", tmp_path / "r.jsonl.partial"
    args = ("data", "regenerate", "--conversations", convs, "--target", random_llama, "--batch-size", "2", *SAMPLED,
            "--out", out)
    interrupt_at(2)
    assert run_cli(*args) == 130
    head, *records = partial.read_text().splitlines()
    records = [json.loads(r) for r in records]
    for r in records:  # as a run on a GPU records it
        r["rng"]["cuda"] = r["rng"]["cpu"]
    partial.write_text("\n".join([head, *map(json.dumps, records)]) + "\n")
    interrupt_at(None)
    capsys.readouterr()
    assert run_cli(*args) == 2
    assert capsys.readouterr().err == f"error: {partial}: this sampled run began on cuda; resume it there, or " \
                                      "delete the file to start over\n"
    assert partial.exists() and not out.exists()


def test_prepare_resumes_an_interrupted_regeneration(random_llama, tmp_path, interrupt_at):
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(5))
    out = tmp_path / "feat"
    args = ("data", "prepare", "--target", random_llama, "--conversations", convs, "--out", out, "--regenerate",
            "--regen-batch-size", "2", "--val-fraction", "0", *SAMPLED)
    interrupt_at(3)  # two rounds of 5 turns, each in batches of 2+2+1: stopped after 2 of 6
    assert run_cli(*args) == 130
    (journal,) = out.glob("regenerated-*.jsonl.partial")
    calls = interrupt_at(None)
    assert run_cli(*args) == 0
    assert len(calls) == 4 and not journal.exists()
    target = load_target(random_llama)
    expected = regenerate(target, read_conversations(convs)[0], temperature=1.0, max_new_tokens=NEW_TOKENS,
                          batch_size=2, seed=3)
    (cache,) = out.glob("regenerated-*.jsonl")
    assert [c.messages for c in read_conversations(cache)[0]] == [c.messages for c in expected]


def test_a_regeneration_resumes_with_its_target_spelled_otherwise(random_llama, tmp_path, interrupt_at, monkeypatch):
    """A journal names the target by what it is: resumed through a relative path, from a copy moved
    elsewhere, begun when the lab checked the path or when it fingerprinted targets the older way, it
    generates only the 2 of 4 batches left."""
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(4))
    args = ("data", "regenerate", "--conversations", convs, "--batch-size", "2", *SAMPLED)
    assert run_cli(*args, "--target", random_llama, "--out", tmp_path / "whole.jsonl") == 0
    moved = tmp_path / "moved"
    shutil.copytree(random_llama, moved)
    monkeypatch.chdir(random_llama.parent)
    out, partial = tmp_path / "r.jsonl", tmp_path / "r.jsonl.partial"
    older = {"path": str(random_llama), "fingerprint": legacy_fingerprint(random_llama)}
    for spelled, recorded in ((random_llama.name, None), (moved, None), (moved, "path"), (moved, "fingerprint")):
        out.unlink(missing_ok=True)
        interrupt_at(3)
        assert run_cli(*args, "--target", random_llama, "--out", out) == 130
        if recorded:  # the journal as a lab that checked the path, or fingerprinted the older way, wrote it
            head, *records = partial.read_text().split("\n")
            head = json.loads(head)
            head["settings"]["target"][recorded] = older[recorded]
            partial.write_text("\n".join([json.dumps(head), *records]))
        calls = interrupt_at(None)
        assert run_cli(*args, "--target", spelled, "--out", out) == 0
        assert len(calls) == 2 and out.read_bytes() == (tmp_path / "whole.jsonl").read_bytes()


def test_prepare_with_other_capture_settings_reuses_the_regeneration(random_llama, tmp_path, monkeypatch,
                                                                     interrupt_at):
    """The regenerated answers are cached by what decides them: a capture that ran out of memory before
    its first shard, run again with a smaller batch (and other lengths, shards, split and turns),
    generates nothing again and ends as a fresh run with those settings."""
    from drafter_lab.data import capture

    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(4))
    out = tmp_path / "feat"
    args = ("data", "prepare", "--target", random_llama, "--conversations", convs, "--regenerate",
            "--regen-batch-size", "2", *SAMPLED)
    real = capture.capture_states

    def out_of_memory(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(capture, "capture_states", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        run_cli(*args, "--out", out, "--batch-size", "8")
    (cache,) = out.glob("regenerated-*.jsonl")
    monkeypatch.setattr(capture, "capture_states", real)
    calls = interrupt_at(None)
    other = ("--batch-size", "2", "--max-length", "200", "--shard-size", "2", "--val-fraction", "0.5",
             "--turns", "each", "--token-exact")
    assert run_cli(*args, "--out", out, *other) == 0
    assert not calls and list(out.glob("regenerated-*")) == [cache]
    assert run_cli(*args, "--out", tmp_path / "fresh", *other) == 0
    assert calls and snapshot(out) == snapshot(tmp_path / "fresh")


def test_a_regeneration_cached_under_the_legacy_fingerprint_is_reused(random_llama, tmp_path, monkeypatch,
                                                                       interrupt_at):
    """A capture that a lab fingerprinting targets the older way began (its regeneration cached, then out of
    memory before the first shard) resumes with nothing generated again, token-exact on those answers, and
    keeps the name it began under."""
    from drafter_lab.data import capture
    from drafter_lab.targets import hf

    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(4))
    out = tmp_path / "feat"
    args = ("data", "prepare", "--target", random_llama, "--conversations", convs, "--out", out, "--regenerate",
            "--regen-batch-size", "2", "--token-exact", *SAMPLED)

    def out_of_memory(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory")

    with monkeypatch.context() as older:
        older.setattr(hf, "fingerprint", legacy_fingerprint)
        older.setattr(capture, "capture_states", out_of_memory)
        with pytest.raises(torch.OutOfMemoryError):
            run_cli(*args)
    (cache,) = out.glob("regenerated-*.jsonl")
    calls = interrupt_at(None)
    assert run_cli(*args) == 0
    assert not calls and list(out.glob("regenerated-*")) == [cache]
    assert Manifest.load(out).target["fingerprint"] == legacy_fingerprint(random_llama) != fingerprint(random_llama)


@pytest.mark.parametrize("who", [("--target", "no-such-target"), ("--server", "http://127.0.0.1:9")])
def test_an_out_that_cannot_be_written_is_refused_before_any_generation(tmp_path, capsys, who):
    """Not after generating everything: the target is not loaded, the server not asked."""
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(2))
    (tmp_path / "a.jsonl").mkdir()
    (tmp_path / "f").touch()
    for out, message in ((tmp_path / "a.jsonl", "--out is a directory"),
                         (tmp_path / "f" / "sub" / "a.jsonl", "--out lies below a file")):
        assert run_cli("data", "regenerate", "--conversations", convs, *who, "--out", out) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {out}: {message}") and err.count("\n") == 1
