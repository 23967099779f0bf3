"""`data prepare --regenerate` of prompts: a user turn without an answer gets the target's, as `data regenerate`
then `data prepare` give it (a file of prompts alone, SpecForge's input for regenerating, was refused: "no
conversation with an assistant turn"); and a regeneration journal begun before the lab answered prompts is
refused, not resumed with its answers after other turns."""

from __future__ import annotations

import json

from data_helpers import PREPARE_ARGS, make_conversations, run_cli, stdlib_lines, write_jsonl
from test_review_s63_prompts_regen import mixed_row, prompt_rows

from drafter_lab import atomic
from drafter_lab.data.capture import REGENERATION_KEYS, resume_settings
from drafter_lab.data.regenerate import SAMPLER, regeneration_settings
from drafter_lab.data.shards import Manifest
from drafter_lab.journal import Journal
from drafter_lab.targets.hf import load_target

GEN = ("--max-new-tokens", "6", "--seed", "0")
SYSTEM_ONLY = {"id": "bare", "conversations": [{"role": "system", "content": "Be brief."}]}


def two_questions_one_answer() -> dict:
    """[user, user, assistant]: a lab before answer slots wrote one answer, after both questions."""
    lines = stdlib_lines()
    return {"id": "uua", "conversations": [{"role": "user", "content": lines[60]},
                                           {"role": "user", "content": lines[61]},
                                           {"role": "assistant", "content": lines[62]}]}


def shards(out) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.safetensors"))}


def test_prepare_regenerate_of_prompts_equals_regenerate_then_prepare(random_llama, tmp_path, capsys):
    rows = [*prompt_rows(4), *prompt_rows(2, turns=2), mixed_row(), two_questions_one_answer(), SYSTEM_ONLY]
    source = write_jsonl(tmp_path / "p.jsonl", rows)
    assert run_cli("data", "regenerate", "--conversations", source, "--out", tmp_path / "r.jsonl",
                   "--target", random_llama, "--batch-size", "3", *GEN) == 0
    assert "(skipped: {'no_user_or_assistant_turn': 1})" in capsys.readouterr().err
    two_step, one_step = tmp_path / "two", tmp_path / "one"
    assert run_cli("data", "prepare", "--target", random_llama, "--conversations", tmp_path / "r.jsonl",
                   "--out", two_step, *PREPARE_ARGS) == 0
    assert run_cli("data", "prepare", "--target", random_llama, "--conversations", source, "--out", one_step,
                   "--regenerate", "--regen-batch-size", "3", *GEN, *PREPARE_ARGS) == 0
    (cache,) = one_step.glob("regenerated-*.jsonl")
    assert cache.read_bytes() == (tmp_path / "r.jsonl").read_bytes()
    assert len(read := cache.read_text().splitlines()) == len(rows) - 1
    assert all(json.loads(r)["conversations"][-1]["role"] == "assistant" for r in read)
    assert shards(one_step) == shards(two_step) and len(shards(one_step)) >= 2
    manifest = Manifest.load(one_step)
    assert manifest.skipped == {"no_user_or_assistant_turn": 1}
    assert manifest.source["regenerate"]["user_turns_without_answer"] == "answered"


def test_prompts_and_empty_rows_are_refused_as_each_mode_reads_them(random_llama, tmp_path, cli_error):
    prompts = write_jsonl(tmp_path / "p.jsonl", prompt_rows(3))
    base = ("data", "prepare", "--target", str(random_llama), "--out", str(tmp_path / "o"))
    # Without --regenerate a prompt has no answer to train on: skipped, and said so, as before.
    assert cli_error([*base, "--conversations", str(prompts)]) == \
        f"error: {prompts}: no conversation with an assistant turn (skipped: {{'no_assistant_turn': 3}})"
    bare = write_jsonl(tmp_path / "s.jsonl", [SYSTEM_ONLY])
    assert cli_error([*base, "--conversations", str(bare), "--regenerate"]) == \
        f"error: {bare}: no conversation with a user or assistant turn (skipped: {{'no_user_or_assistant_turn': 1}})"
    mixed = write_jsonl(tmp_path / "m.jsonl", [*prompt_rows(2), SYSTEM_ONLY])
    assert cli_error([*base, "--conversations", str(mixed), "--regenerate", "--strict"]) == \
        f"error: {mixed}: conversation bare has no user or assistant turn (--strict)"
    assert not (tmp_path / "o").exists()


def test_a_killed_prompt_capture_resumes_as_if_whole(random_llama, tmp_path, interrupt_at):
    """6 rows of 2 prompts in batches of 2, sampled: 6 batches. Stopped in the 4th, the resumed capture
    generates the 3 left and writes the uninterrupted run's cache and shards."""
    source = write_jsonl(tmp_path / "p.jsonl", prompt_rows(6, turns=2))
    args = ("data", "prepare", "--target", random_llama, "--conversations", source, "--regenerate",
            "--regen-batch-size", "2", "--temperature", "1.0", "--max-new-tokens", "6", "--seed", "3", *PREPARE_ARGS)
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert run_cli(*args, "--out", whole) == 0
    interrupt_at(4)
    assert run_cli(*args, "--out", resumed) == 130
    (journal,) = resumed.glob("regenerated-*.jsonl.partial")
    assert len(journal.read_text().splitlines()) == 1 + 3
    calls = interrupt_at(None)
    assert run_cli(*args, "--out", resumed) == 0
    assert len(calls) == 3 and not journal.exists()
    (cache,) = whole.glob("regenerated-*.jsonl")
    assert (resumed / cache.name).read_bytes() == cache.read_bytes()
    assert shards(resumed) == shards(whole)


def test_a_prompt_cache_from_before_is_not_reused(random_llama, tmp_path):
    """A cache named as a lab before answer slots named it (which skipped rows of prompts alone) is
    another regeneration's: a capture regenerates instead of training on it."""
    source = write_jsonl(tmp_path / "p.jsonl", [*prompt_rows(2), *make_conversations(2)])
    args = ("data", "prepare", "--target", random_llama, "--conversations", source, "--regenerate", *GEN,
            *PREPARE_ARGS)
    fresh, stale = tmp_path / "fresh", tmp_path / "stale"
    assert run_cli(*args, "--out", fresh) == 0
    manifest = Manifest.load(fresh)

    def cache_name(source: dict) -> str:
        settings = resume_settings(manifest.target, manifest.aux_layer_ids, manifest.dtype, source)
        return f"regenerated-{atomic.sha256_json({k: settings[k] for k in REGENERATION_KEYS if k in settings})[:12]}.jsonl"

    (cache,) = fresh.glob("regenerated-*.jsonl")
    assert cache.name == cache_name(manifest.source)
    before = {**manifest.source, "regenerate": {k: v for k, v in manifest.source["regenerate"].items()
                                                 if k != "user_turns_without_answer"}}
    stale.mkdir()
    old = [json.loads(r) for r in cache.read_text().splitlines()[2:]]  # the rows with answers alone
    write_jsonl(stale / cache_name(before), old)
    assert run_cli(*args, "--out", stale) == 0
    assert shards(stale) == shards(fresh)


def test_answered_files_keep_their_settings(random_llama, tmp_path, interrupt_at):
    """Where every user turn has its answer the settings are as before, so caches and journals made before
    are found: no prompts key in a capture's or a regeneration journal's settings."""
    source = write_jsonl(tmp_path / "c.jsonl", make_conversations(3))
    assert run_cli("data", "prepare", "--target", random_llama, "--conversations", source, "--out",
                   tmp_path / "f", "--regenerate", *GEN, *PREPARE_ARGS) == 0
    assert Manifest.load(tmp_path / "f").source["regenerate"] == {"temperature": 0.0, "max_new_tokens": 6,
                                                                  "regen_batch_size": 16, "seed": 0, **SAMPLER}
    interrupt_at(2)
    partial = tmp_path / "r.jsonl.partial"
    assert run_cli("data", "regenerate", "--conversations", source, "--out", tmp_path / "r.jsonl",
                   "--target", random_llama, "--batch-size", "2", *GEN) == 130
    assert Journal.settings_of(partial) == regeneration_settings(load_target(random_llama), source, 0.0, 6, 2, 0)


def test_a_journal_from_before_answer_slots_is_refused(random_llama, tmp_path, cli_error):
    """A lab before answer slots journalled a [user, user, answer] row's one answer as round 0, the answer
    to both questions; now round 0 is the first question's: resumed, that answer landed after it."""
    source = write_jsonl(tmp_path / "c.jsonl", [two_questions_one_answer(), *make_conversations(3)[1:]])
    out, partial = tmp_path / "r.jsonl", tmp_path / "r.jsonl.partial"
    older = regeneration_settings(load_target(random_llama), source, 0.0, 6, 16, 0)  # as it recorded them
    with Journal(partial, older) as journal:
        journal.append({"round": 0, "answers": {c: "to both" for c in ("uua", "chat-1", "chat-2")},
                        "token_ids": {c: [5, 6] for c in ("uua", "chat-1", "chat-2")}})
    assert cli_error(["data", "regenerate", "--conversations", str(source), "--out", str(out),
                      "--target", str(random_llama), *GEN]) == (
        f"error: {partial}: begun before the lab recorded that it answers user turns without an answer: its "
        "answers may be those of other turns than they would fill now; delete it to start over")
    assert partial.exists() and not out.exists()
