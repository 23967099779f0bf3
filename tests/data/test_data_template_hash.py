"""The chat template is part of what the text is: manifests, regeneration journals, online runs,
evals and sweeps name its hash (`chat_template_sha256`), so text rendered with an edited template is
not resumed into data made with the old one. Work begun before the lab recorded it resumes as it did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from data_helpers import make_conversations, run_cli, write_jsonl
from test_data_reasoning import THINKING

from drafter_lab import atomic
from drafter_lab.data.capture import resume_settings
from drafter_lab.data.capture_config import TEMPLATE_HASH
from drafter_lab.data.chat import template_sha256
from drafter_lab.data.shards import MANIFEST, Manifest
from drafter_lab.targets.hf import load_tokenizer

GEN = ("--max-new-tokens", "4", "--seed", "0")
BEGUN = "begun before the lab recorded chat templates, so its template is not checked"


@pytest.fixture
def model(random_llama, tmp_path):
    """A copy of the random Llama whose chat template a test may edit."""
    from transformers import LlamaForCausalLM

    out = tmp_path / "model"
    LlamaForCausalLM.from_pretrained(random_llama).save_pretrained(out)
    load_tokenizer(random_llama).save_pretrained(out)
    return out


def edit_template(model: Path, template: str) -> None:
    tok = load_tokenizer(model)
    tok.chat_template = template
    tok.save_pretrained(model)


def strip_hash(path: Path, *keys: str) -> None:
    """Rewrite a JSON file (or a journal's first line) as a lab before the hash wrote it: the same
    settings without `chat_template_sha256` under `keys`."""
    lines = path.read_text().split("\n")
    head = json.loads(lines[0] if path.suffix == ".partial" else path.read_text())
    inner = head
    for k in keys:
        inner = inner[k]
    del inner[TEMPLATE_HASH]
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


def test_a_capture_refuses_to_resume_with_an_edited_template(model, tmp_path, capsys):
    out = tmp_path / "feat"
    args = prepare(model, tmp_path, out)
    assert run_cli(*args) == 0
    recorded = Manifest.load(out).source[TEMPLATE_HASH]
    assert recorded == template_sha256(load_tokenizer(model))
    edit_template(model, THINKING)
    capsys.readouterr()
    assert run_cli(*args) == 2
    err = capsys.readouterr().err
    assert f"{TEMPLATE_HASH}: '{recorded}' there, '{template_sha256(load_tokenizer(model))}' now" in err
    assert str(out / MANIFEST) in err and len(err.strip().splitlines()) == 1


def test_a_manifest_from_before_resumes_unchecked(model, tmp_path, capsys):
    out = tmp_path / "feat"
    args = prepare(model, tmp_path, out)
    assert run_cli(*args) == 0
    strip_hash(out / MANIFEST, "source")
    killed = Manifest.load(out)  # ... after its first shard
    (out / killed.shards["train"][1]["file"]).unlink()
    edit_template(model, THINKING)  # unseen: the manifest does not say which template it had
    capsys.readouterr()
    assert run_cli(*args) == 0
    assert BEGUN in " ".join(capsys.readouterr().err.split())
    resumed = Manifest.load(out)
    assert TEMPLATE_HASH not in resumed.source and len(resumed.shards["train"]) == 2


def test_a_regeneration_from_before_resumes_under_its_name(model, tmp_path, interrupt_at, capsys):
    """Killed while it regenerated (no manifest yet): its journal, named by settings without the hash,
    is found and resumed, not begun again."""
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
    assert cache.name == name(settings)
    fresh = cache.read_text()
    for p in out.iterdir():
        p.unlink()

    interrupt_at(3)
    assert run_cli(*args) == 130
    (partial,) = out.glob("regenerated-*.jsonl.partial")
    strip_hash(partial, "settings")
    older = {k: v for k, v in settings.items() if k != TEMPLATE_HASH}
    partial.rename(out / (name(older) + ".partial"))
    rounds = interrupt_at(None)
    capsys.readouterr()
    assert run_cli(*args) == 0
    assert len(rounds) == 2  # rounds 1 and 2 came from the journal
    assert BEGUN in " ".join(capsys.readouterr().err.split())
    assert (out / name(older)).read_text() == fresh and TEMPLATE_HASH not in Manifest.load(out).source


def test_data_regenerate_journals_name_it(model, tmp_path, interrupt_at, capsys):
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
    assert json.loads(partial.read_text().split("\n")[0])["settings"][TEMPLATE_HASH] == template_sha256(
        load_tokenizer(model))
    saved = partial.read_text()
    strip_hash(partial, "settings")  # as a lab before the hash wrote it
    rounds = interrupt_at(None)
    capsys.readouterr()
    assert run_cli(*args) == 0
    assert len(rounds) == 4 and out.read_text() == fresh  # 6 turns, 2 from the journal
    assert BEGUN in " ".join(capsys.readouterr().err.split())
    out.unlink()
    partial.write_text(saved)
    edit_template(model, THINKING)
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
                "chat_template_kwargs": {"enable_thinking": False}}
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
