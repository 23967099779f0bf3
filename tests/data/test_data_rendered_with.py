"""The chat template and the tokenizer are part of what the text is: manifests, regeneration
journals, online runs, evals and sweeps name their hashes (`rendered_with`: `chat_template_sha256`,
`tokenizer_sha256`), so text rendered or tokenized otherwise is not resumed into data made the old way.
Work begun before the lab recorded them resumes as it did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from data_helpers import make_conversations, run_cli, write_jsonl
from test_data_reasoning import THINKING

from drafter_lab import atomic
from drafter_lab.data.capture import REGENERATION_KEYS, resume_settings
from drafter_lab.data.capture_config import STOP_IDS, TEMPLATE_HASH, TOKENIZER_HASH, without
from drafter_lab.data.chat import rendered_with, template_sha256, tokenizer_sha256
from drafter_lab.data.shards import MANIFEST, Manifest
from drafter_lab.targets.hf import load_tokenizer

GEN = ("--max-new-tokens", "4", "--seed", "0")
ERAS = {"before 2026-12-02": ((TEMPLATE_HASH, TOKENIZER_HASH), "begun before the lab recorded chat templates "
                              "and tokenizers, so its template and tokenizer are not checked"),
        "2026-12-02": ((TOKENIZER_HASH,), "begun before the lab recorded tokenizers, so its tokenizer is not checked")}
"""The settings work made on each day lacks, and the line its resume says."""
REGEN_ERAS = {"before 2026-12-02": ((TEMPLATE_HASH, TOKENIZER_HASH, STOP_IDS), "begun before the lab recorded chat "
                                    "templates, tokenizers and stop token sets, so its template, tokenizer and stop "
                                    "token set are not checked"),
              "2026-12-02": ((TOKENIZER_HASH, STOP_IDS), "begun before the lab recorded tokenizers and stop token "
                             "sets, so its tokenizer and stop token set are not checked"),
              "2026-12-03": ((STOP_IDS,), "begun before the lab recorded stop token sets, so its stop token set is "
                             "not checked")}
"""Likewise for a regeneration, which names its stop tokens since 2026-12-04."""


@pytest.fixture
def model(random_llama, tmp_path):
    """A copy of the random Llama whose chat template or tokenizer a test may edit."""
    from transformers import LlamaForCausalLM

    out = tmp_path / "model"
    LlamaForCausalLM.from_pretrained(random_llama).save_pretrained(out)
    load_tokenizer(random_llama).save_pretrained(out)
    return out


def edit_template(model: Path, template: str) -> None:
    tok = load_tokenizer(model)
    tok.chat_template = template
    tok.save_pretrained(model)


def strip_hash(path: Path, *keys: str, hashes) -> None:
    """Rewrite a JSON file (or a journal's first line) as a lab before the hashes wrote it: the same
    settings without `hashes` under `keys`."""
    lines = path.read_text().split("\n")
    head = json.loads(lines[0] if path.suffix == ".partial" else path.read_text())
    inner = head
    for k in keys:
        inner = inner[k]
    for h in hashes:
        del inner[h]
    if path.suffix == ".partial":
        path.write_text("\n".join([json.dumps(head), *lines[1:]]))
    else:
        path.write_text(json.dumps(head))


def prepare(model: Path, tmp_path: Path, out: Path) -> tuple:
    """`data prepare` of 4 conversations into 2 shards."""
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(4))
    return ("data", "prepare", "--target", model, "--conversations", convs, "--out", out, "--max-length", "128",
            "--shard-size", "2", "--val-fraction", "0")


def test_the_hash_follows_the_template(random_llama):
    tok = load_tokenizer(random_llama)
    plain = template_sha256(tok)
    assert template_sha256(load_tokenizer(random_llama)) == plain and len(plain) == 16
    tok.chat_template = THINKING
    assert template_sha256(tok) != plain
    tok.chat_template = {"default": THINKING, "tool_use": THINKING + "{{ tools }}"}
    named = template_sha256(tok)
    tok.chat_template["tool_use"] = THINKING
    assert template_sha256(tok) != named  # named templates count whole


def edit_tokenizer(model: Path) -> None:
    """What a model update's tokenizer fix does, the weights unchanged: another end-of-turn token."""
    tok = load_tokenizer(model)
    tok.eos_token = "<|endoftext|>"
    tok.save_pretrained(model)


def test_the_tokenizer_hash_follows_what_encoding_sees(random_llama):
    from tokenizers import normalizers

    from drafter_lab.targets.tokenizer import train_bpe

    tok = load_tokenizer(random_llama)
    plain = tokenizer_sha256(tok)
    assert tokenizer_sha256(load_tokenizer(random_llama)) == plain and len(plain) == 16
    tok.chat_template = THINKING
    assert tokenizer_sha256(tok) == plain  # the template has a hash of its own
    assert rendered_with(tok, None) == {TEMPLATE_HASH: template_sha256(tok), TOKENIZER_HASH: plain}
    changed = []
    for edit in (lambda t: t.add_tokens(["<tool_call>"], special_tokens=True),
                 lambda t: setattr(t, "eos_token", "<|endoftext|>"),
                 lambda t: setattr(t.backend_tokenizer, "normalizer", normalizers.NFKC())):
        tok = load_tokenizer(random_llama)
        edit(tok)
        changed.append(tokenizer_sha256(tok))
    retrained = train_bpe(["another corpus, another vocabulary"] * 4, 300)
    assert len({plain, *changed, tokenizer_sha256(retrained)}) == 5


def test_the_tokenizer_hash_is_the_recorded_one_and_reads_the_vocabulary_once(random_llama, monkeypatch):
    from drafter_lab.atomic import sha256_json
    from drafter_lab.data.chat import TOKENIZER_PROBE

    tok = load_tokenizer(random_llama)

    def as_recorded(t):  # the formula manifests written before the vocabulary's part was kept
        probe = TOKENIZER_PROBE + "".join(sorted(set(t.all_special_tokens)))
        ids = t(probe, add_special_tokens=False)["input_ids"]
        return sha256_json([sorted(t.get_vocab().items()), t.special_tokens_map, ids])[:16]

    first = tokenizer_sha256(tok)
    assert first == as_recorded(tok)
    reads = []
    get_vocab = type(tok).get_vocab
    monkeypatch.setattr(type(tok), "get_vocab", lambda t: reads.append(1) or get_vocab(t))
    assert tokenizer_sha256(tok) == first and not reads, "the vocabulary was read again"
    tok.eos_token = "<|endoftext|>"  # no new entry: the vocabulary's part holds, the rest does not
    assert tokenizer_sha256(tok) == as_recorded(tok) != first and len(reads) == 1
    tok.add_tokens(["<tool_call>"], special_tokens=True)  # a new entry: read again
    assert tokenizer_sha256(tok) == as_recorded(tok) and len(reads) == 3


@pytest.mark.parametrize("edit, key, hashed", [(lambda m: edit_template(m, THINKING), TEMPLATE_HASH, template_sha256),
                                               (edit_tokenizer, TOKENIZER_HASH, tokenizer_sha256)])
def test_a_capture_refuses_to_resume_rendered_otherwise(model, tmp_path, capsys, edit, key, hashed):
    out = tmp_path / "feat"
    args = prepare(model, tmp_path, out)
    assert run_cli(*args) == 0
    recorded = Manifest.load(out).source[key]
    assert recorded == hashed(load_tokenizer(model))
    edit(model)
    capsys.readouterr()
    assert run_cli(*args) == 2
    err = capsys.readouterr().err
    assert f"{key}: '{recorded}' there, '{hashed(load_tokenizer(model))}' now" in err
    assert str(out / MANIFEST) in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("era", ERAS)
def test_a_manifest_from_before_resumes_unchecked(model, tmp_path, capsys, era):
    unseen, begun = ERAS[era]
    out = tmp_path / "feat"
    args = prepare(model, tmp_path, out)
    assert run_cli(*args) == 0
    strip_hash(out / MANIFEST, "source", hashes=unseen)
    killed = Manifest.load(out)  # ... after its first shard
    (out / killed.shards["train"][1]["file"]).unlink()
    edit_tokenizer(model)  # unseen: the manifest does not say which tokenizer it had
    if TEMPLATE_HASH in unseen:
        edit_template(model, THINKING)
    capsys.readouterr()
    assert run_cli(*args) == 0
    assert begun in " ".join(capsys.readouterr().err.split())
    resumed = Manifest.load(out)
    assert not set(unseen) & resumed.source.keys() and len(resumed.shards["train"]) == 2


@pytest.mark.parametrize("era", REGEN_ERAS)
def test_a_regeneration_from_before_resumes_under_its_name(model, tmp_path, interrupt_at, capsys, era):
    """Killed while it regenerated (no manifest yet): its journal, named by settings without the
    hashes of its day, is found and resumed, not begun again."""
    unseen, begun = REGEN_ERAS[era]
    convs = write_jsonl(tmp_path / "c.jsonl", [dict(r, conversations=r["conversations"][:-2])
                                               for r in make_conversations(4)])
    out = tmp_path / "feat"
    args = ("data", "prepare", "--target", model, "--conversations", convs, "--out", out, "--val-fraction", "0",
            "--regenerate", "--regen-batch-size", "1", *GEN)
    assert run_cli(*args) == 0
    manifest = Manifest.load(out)
    settings = resume_settings(manifest.target, manifest.aux_layer_ids, manifest.dtype, manifest.source)
    name = lambda s: f"regenerated-{atomic.sha256_json(s)[:12]}.jsonl"  # noqa: E731
    (cache,) = out.glob("regenerated-*.jsonl")
    assert cache.name == name({k: v for k, v in settings.items() if k in REGENERATION_KEYS})
    fresh = cache.read_text()
    for p in out.iterdir():
        p.unlink()

    interrupt_at(3)
    assert run_cli(*args) == 130
    (partial,) = out.glob("regenerated-*.jsonl.partial")
    older = without(settings, unseen)  # as a lab of its day began it: named by, and journalling, all its settings
    records = partial.read_text().split("\n")[1:]
    (out / (name(older) + ".partial")).write_text("\n".join([json.dumps({"settings": older}), *records]))
    partial.unlink()
    rounds = interrupt_at(None)
    capsys.readouterr()
    assert run_cli(*args) == 0
    assert len(rounds) == 2  # rounds 1 and 2 came from the journal
    assert begun in " ".join(capsys.readouterr().err.split())
    assert (out / name(older)).read_text() == fresh and not set(unseen) & Manifest.load(out).source.keys()


def test_data_regenerate_journals_name_it(model, random_llama, tmp_path, interrupt_at, capsys):
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(3))
    out = tmp_path / "r.jsonl"
    args = ("data", "regenerate", "--conversations", convs, "--out", out, "--target", model, "--batch-size", "1",
            *GEN)
    assert run_cli(*args) == 0
    fresh = out.read_text()
    out.unlink()
    interrupt_at(3)
    assert run_cli(*args) == 130
    partial = tmp_path / "r.jsonl.partial"
    settings = json.loads(partial.read_text().split("\n")[0])["settings"]
    assert rendered_with(load_tokenizer(model), None).items() <= settings.items()
    saved = partial.read_text()
    unseen, begun = REGEN_ERAS["before 2026-12-02"]
    strip_hash(partial, "settings", hashes=unseen)  # as a lab before the hashes wrote it
    rounds = interrupt_at(None)
    capsys.readouterr()
    assert run_cli(*args) == 0
    assert len(rounds) == 4 and out.read_text() == fresh  # 6 turns, 2 from the journal
    assert begun in " ".join(capsys.readouterr().err.split())
    for edit in (lambda: edit_template(model, THINKING), lambda: edit_tokenizer(model)):
        out.unlink(missing_ok=True)
        partial.write_text(saved)
        load_tokenizer(random_llama).save_pretrained(model)
        edit()
        assert run_cli(*args) == 2
        assert "partial run made with other settings" in capsys.readouterr().err


def test_token_exact_takes_answers_prompted_as_it_renders(model, tmp_path, capsys):
    """Each regenerated answer says how its prompt was rendered: a token-exact capture of answers that
    followed other prompts (thinking off there, on here; or an edited template) is refused, naming the
    conversation; captured as text, they train with a note."""
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(3))
    answers = tmp_path / "r.jsonl"
    off = ("--chat-template-kwargs", json.dumps({"enable_thinking": False}))
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", answers, "--target", model, *GEN, *off) == 0
    rows = [json.loads(line) for line in answers.read_text().splitlines()]
    prompted = {"chat_template_sha256": template_sha256(load_tokenizer(model)),
                "chat_template_kwargs": {"enable_thinking": False},
                "tokenizer_sha256": tokenizer_sha256(load_tokenizer(model))}
    assert all(m["rendered_with"] == prompted for r in rows for m in r["conversations"] if m["role"] == "assistant")
    prepare = ("data", "prepare", "--target", model, "--conversations", answers, "--val-fraction", "0")
    assert run_cli(*prepare, "--out", tmp_path / "same", "--token-exact", *off) == 0
    capsys.readouterr()
    assert run_cli(*prepare, "--out", tmp_path / "on", "--token-exact") == 2
    err = capsys.readouterr().err
    assert f"{answers}: conversation {rows[0]['id']}:" in err and "answers sampled after prompts rendered" in err
    assert err.count("\n") == 1 and not (tmp_path / "on").exists()
    assert run_cli(*prepare, "--out", tmp_path / "text") == 0
    assert f"{answers}: 3 of 3 conversations hold answers sampled after prompts rendered otherwise than here" in \
        " ".join(capsys.readouterr().err.split())
    edit_template(model, THINKING)
    assert run_cli(*prepare, "--out", tmp_path / "edited", "--token-exact", *off) == 2
    assert "answers sampled after prompts rendered" in capsys.readouterr().err


def test_answers_from_before_tokenizers_were_recorded_stay_token_exact(model, tmp_path, capsys):
    """Answers regenerated on 2026-12-02 say how their prompts were rendered but not tokenized: a
    token-exact capture takes them on what they record; answers naming another tokenizer it refuses."""
    answers = tmp_path / "r.jsonl"
    assert run_cli("data", "regenerate", "--conversations", write_jsonl(tmp_path / "c.jsonl", make_conversations(2)),
                   "--out", answers, "--target", model, *GEN) == 0
    rows = [json.loads(line) for line in answers.read_text().splitlines()]

    def recorded(tokenizer_hash):
        for m in (m for r in rows for m in r["conversations"] if m["role"] == "assistant"):
            m["rendered_with"] = without(m["rendered_with"], [TOKENIZER_HASH]) | tokenizer_hash
        return write_jsonl(tmp_path / f"r{len(tokenizer_hash)}.jsonl", rows)

    prepare = ("data", "prepare", "--target", model, "--val-fraction", "0", "--token-exact")
    capsys.readouterr()
    assert run_cli(*prepare, "--conversations", recorded({}), "--out", tmp_path / "dated") == 0
    assert "rendered otherwise" not in capsys.readouterr().err
    assert run_cli(*prepare, "--conversations", recorded({TOKENIZER_HASH: "0" * 16}), "--out", tmp_path / "other") == 2
    assert "answers sampled after prompts rendered with" in capsys.readouterr().err


def test_a_regeneration_names_its_stop_tokens(model, tmp_path, interrupt_at, capsys):
    """A generation_config.json that adds an end token (as Llama 3's update added <|eot_id|>) leaves the
    weights, config and tokenizer as they were, but cuts the answers: a cached regeneration, or a data
    regenerate journal, from before is not reused."""
    from collections import Counter

    from drafter_lab.data.conversations import read_conversations

    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(4))
    out = tmp_path / "feat"
    args = ("data", "prepare", "--target", model, "--conversations", convs, "--out", out, "--val-fraction", "0",
            "--regenerate", "--max-new-tokens", "16")
    assert run_cli(*args) == 0
    (cache,) = out.glob("regenerated-*.jsonl")
    sampled = Counter(t for c in read_conversations(cache)[0] for m in c.messages for t in m.get("token_ids", []))
    stop = sampled.most_common(1)[0][0]
    for p in out.iterdir():  # killed after the regeneration was cached, before its first shard landed
        if p != cache:
            p.unlink()
    config = json.loads((model / "generation_config.json").read_text())
    eos = config["eos_token_id"]
    (model / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": [eos, stop]}))
    assert run_cli(*args) == 0
    assert Manifest.load(out).source[STOP_IDS] == [eos, stop]
    (now,) = set(out.glob("regenerated-*.jsonl")) - {cache}
    assert not any(stop in m.get("token_ids", []) for c in read_conversations(now)[0] for m in c.messages)

    regenerated = tmp_path / "r.jsonl"
    args = ("data", "regenerate", "--conversations", convs, "--out", regenerated, "--target", model, *GEN)
    interrupt_at(2)
    assert run_cli(*args) == 130
    (model / "generation_config.json").write_text(json.dumps(config))
    interrupt_at(None)
    capsys.readouterr()
    assert run_cli(*args) == 2
    assert "partial run made with other settings" in capsys.readouterr().err
