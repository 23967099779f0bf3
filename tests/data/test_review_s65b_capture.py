"""Capture, second mutation pass: check_config at its edges, and which tool-call turns a token-exact
capture passes over."""

from __future__ import annotations

import pytest

from drafter_lab.data.capture import CaptureConfig, check_config, sequences_of
from drafter_lab.data.conversations import Conversation
from drafter_lab.errors import LabError


@pytest.mark.parametrize("name", ["max_length", "batch_size", "shard_size", "max_new_tokens", "regen_batch_size",
                                  "tokenize_workers"])
def test_a_count_setting_below_one_is_refused_by_name(name):
    with pytest.raises(LabError) as e:
        check_config(CaptureConfig(**{name: 0}))
    assert str(e.value) == f"{name} must be at least 1, got 0"


@pytest.mark.parametrize(("fraction", "ok"), [(0.0, True), (0.999, True), (1.0, False), (-0.1, False)])
def test_val_fraction_lies_in_zero_to_one_excluding_one(fraction, ok):
    """1.0 puts every sequence in val: nothing would be left to train on."""
    if ok:
        check_config(CaptureConfig(val_fraction=fraction))
        return
    with pytest.raises(LabError, match=r"val_fraction must be in \[0, 1\)"):
        check_config(CaptureConfig(val_fraction=fraction))


def test_token_exact_passes_over_tool_call_turns_without_token_ids_only():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    msgs = [{"role": "user", "content": "a"},
            {"role": "assistant", "content": "", "tool_calls": [call], "token_ids": [1, 2]},  # sampled: trains
            {"role": "tool", "content": "1", "tool_call_id": "c1", "name": "f"},
            {"role": "assistant", "content": "", "tool_calls": [call]},  # kept as recorded: trains nothing
            {"role": "tool", "content": "2", "tool_call_id": "c1", "name": "f"},
            {"role": "assistant", "content": "done", "token_ids": [3]}]
    conv = Conversation("c", msgs)
    assert [s.id for s in sequences_of([conv], "each", token_exact=True)] == ["c#turn1", "c#turn3"]
    assert [s.id for s in sequences_of([conv], "each")] == ["c#turn1", "c#turn2", "c#turn3"]
    (last,) = sequences_of([Conversation("c", msgs[:4])], "last", token_exact=True)
    assert last.messages == msgs[:2]  # cut after the last turn that trains


def _manifest(source):
    from drafter_lab.data.shards import Manifest

    return Manifest(target={"fingerprint": "fp", "hidden_size": 4}, aux_layer_ids=[1, 2, 3], dtype="float32",
                    source=source)


SOURCE = {"conversations": "/a/c.jsonl", "sha256": "s", "max_length": 64, "val_fraction": 0.25, "shard_size": 4,
          "batch_size": 2, "planned": {"train": {"sequences": 8, "shards": 2}}}


def test_a_resume_may_move_the_conversations_but_not_change_a_setting(tmp_path):
    from drafter_lab.data.capture import check_resumable, resume_settings

    existing = _manifest(SOURCE)
    moved = {**SOURCE, "conversations": "/b/c.jsonl", "dir": "/b", "planned": {}}
    check_resumable(tmp_path, existing, resume_settings(existing.target, [1, 2, 3], "float32", moved))
    for key, value, there in [("shard_size", 5, 4), ("batch_size", 1, 2), ("token_exact", True, None)]:
        now = resume_settings(existing.target, [1, 2, 3], "float32", {**SOURCE, key: value})
        with pytest.raises(LabError) as e:
            check_resumable(tmp_path, existing, now)
        assert str(e.value) == (f"{tmp_path / 'manifest.json'}: manifest was made with other settings ({key}: "
                                f"{there!r} there, {value!r} now); use another --out or delete it")


def test_an_out_dir_without_manifest_may_hold_only_what_a_killed_run_left(tmp_path):
    from drafter_lab.data.capture import check_out_dir

    out = tmp_path / "feat"
    out.mkdir()
    for name in ("train-00000.safetensors", "regenerated-0123456789ab.jsonl.partial", ".train-00001.safetensors.x.tmp"):
        (out / name).write_bytes(b"")
    check_out_dir(out)
    (out / "train-1.safetensors").write_bytes(b"")  # not a name shard_name gives
    (out / "notes.txt").write_bytes(b"")
    with pytest.raises(LabError) as e:
        check_out_dir(out)
    assert str(e.value) == f"{out}: output directory holds other files (notes.txt, train-1.safetensors) and no manifest"
    (out / "manifest.json").write_text("{}")  # a capture to resume: what else it holds is the user's
    check_out_dir(out)


def test_plan_shards_cuts_each_split_in_input_order_into_shard_size_chunks():
    from drafter_lab.data.capture import plan_shards, split_of

    items = [(f"c{i}#turn1", i) for i in range(23)]
    plan = plan_shards(items, 0.3, 4)
    for s in ("train", "val"):
        mine = [it for it in items if split_of(it[0], 0.3) == s]
        assert [it for chunk in plan[s] for it in chunk] == mine
        assert [len(c) for c in plan[s]] == [4] * (len(mine) // 4) + ([len(mine) % 4] if len(mine) % 4 else [])
    assert plan["val"] and plan["train"]
    assert plan_shards(items, 0.0, 23) == {"train": [items], "val": []}


def test_a_resume_keeps_no_row_whose_shard_is_gone(tmp_path):
    """An import (`holds` None) resumed after its shard was deleted writes that shard again."""
    from drafter_lab.data.capture import _kept

    rows = [{"file": f"train-0000{k}.safetensors", "sequences": 1, "tokens": 2, "loss_tokens": 1, "sha256": "x"}
            for k in range(3)]
    for r in rows[::2]:
        (tmp_path / r["file"]).write_bytes(b"")
    existing = _manifest({})
    existing.shards = {"train": rows, "val": []}
    assert _kept(tmp_path, existing, {}, None, True) == {"train": rows[::2], "val": []}


def test_capture_progress_counts_the_tokens_of_a_batch_not_its_padding(random_llama):
    import torch

    from drafter_lab.data.capture import capture_states
    from drafter_lab.targets.hf import load_target

    target = load_target(random_llama)
    items = [(f"s{n}", torch.arange(3, 3 + n), torch.ones(n, dtype=torch.bool)) for n in (3, 5, 4)]
    calls, put = [], {}
    capture_states(target, items, [1, 2, 3], torch.float32, 2, lambda n, **f: calls.append((n, f)),
                   put.__setitem__)
    assert calls == [(2, {"tokens": 9}), (1, {"tokens": 3})]  # longest first: (5, 4), then (3)
    assert sorted(put) == [0, 1, 2] and [len(put[j].input_ids) for j in range(3)] == [3, 5, 4]


@pytest.mark.parametrize(("source", "want"), [
    ({"token_exact": True, "regenerate": {"temperature": 0.7}}, 0.7),
    ({"regenerate": {"temperature": 0.7}}, None),  # retokenized text: not the target's own samples
    ({"token_exact": True, "sampled_at": 0.5}, 0.5),
    ({}, None),
])
def test_sampled_at_only_for_token_exact_regenerations_or_as_recorded(source, want):
    from drafter_lab.data.capture import sampled_at

    assert sampled_at(source) == want


def test_the_manifest_records_each_setting_that_moves_the_states(features, conversations_file):
    """batch_size too: padding in a batch moves the states' low bits, so a resume with another is refused."""
    import json

    source = json.loads((features / "manifest.json").read_text())["source"]
    assert {k: source[k] for k in ("conversations", "max_length", "val_fraction", "shard_size", "batch_size")} == {
        "conversations": str(conversations_file), "max_length": 256, "val_fraction": 0.25, "shard_size": 4,
        "batch_size": 3}
    assert source["regenerate"] is None


def test_an_out_that_is_a_file_is_refused(tmp_path):
    from drafter_lab.data.capture import check_out_dir

    (tmp_path / "f").write_text("")
    with pytest.raises(LabError) as e:
        check_out_dir(tmp_path / "f")
    assert str(e.value) == f"{tmp_path / 'f'}: output path exists and is not a directory"


@pytest.mark.parametrize("made_before", [False, True])
def test_a_capture_failing_before_its_first_shard_removes_only_a_directory_it_made(tmp_path, made_before):
    """An empty --out the user made stays; one the run made goes."""
    import torch

    from drafter_lab.data.capture import write_planned

    out = tmp_path / "feat"
    if made_before:
        out.mkdir()

    def compute(chunk, advance, put):
        raise LabError("target failed")

    plan = {"train": [[("a", torch.ones(2, dtype=torch.long), torch.ones(2, dtype=torch.bool))]], "val": []}
    with pytest.raises(LabError, match="target failed"):
        write_planned(out, _manifest({}), None, plan, torch.float32, lambda it: len(it[1]), compute, main=True)
    assert out.is_dir() == made_before


def test_a_sequence_whose_answer_lies_past_max_length_is_counted_skipped(random_llama, tmp_path):
    from data_helpers import write_jsonl

    from drafter_lab.data.capture import prepare_features

    rows = [{"id": "long", "conversations": [{"role": "user", "content": "word " * 200},
                                             {"role": "assistant", "content": "yes"}]},
            {"id": "short", "conversations": [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "hello there"}]}]
    m = prepare_features(random_llama, write_jsonl(tmp_path / "c.jsonl", rows), tmp_path / "out", max_length=48,
                         val_fraction=0.0)
    assert m.skipped == {"no_loss_tokens_within_max_length": 1}
    assert m.counts("train")["sequences"] == 1
