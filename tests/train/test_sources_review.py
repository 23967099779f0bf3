"""Online training reads the temperature each answer was sampled at by its conversation's id: a
conversation whose own id ends like a per-turn sequence's (`x#turn1`) is still itself."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from drafter_lab.cli import main
from drafter_lab.data.capture import CaptureConfig
from drafter_lab.train.sources import Online

from .conftest import write_conversations

EXACT = CaptureConfig(max_length=96, val_fraction=0.25, token_exact=True)


@pytest.fixture(scope="module")
def sampled(peaked_llama, tmp_path_factory):
    """Conversations whose answers the target sampled at 0.8 (`data regenerate`)."""
    root = tmp_path_factory.mktemp("sources_review")
    convs = write_conversations(root / "convs.jsonl", 16)
    assert main(["data", "regenerate", "--target", str(peaked_llama), "--conversations", str(convs),
                 "--out", str(root / "sampled.jsonl"), "--temperature", "0.8", "--max-new-tokens", "24",
                 "--seed", "1"]) == 0
    return root / "sampled.jsonl"


def renamed(src, dst, name):
    """`src` with each conversation's id `name(id)`."""
    rows = [json.loads(line) for line in src.read_text().splitlines()]
    for r in rows:
        r["id"] = name(r["id"])
    dst.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dst


@pytest.mark.parametrize("turns", ["all", "last"])
def test_an_id_like_a_turns_is_its_conversations_own(peaked_llama, sampled, tmp_path, turns):
    """Ids `c<i>#turn1` (no `c<i>` beside them): every answer was sampled at 0.8, so validation replays,
    on the training file's val split and on a held-out file alike."""
    cfg, cpu = dataclasses.replace(EXACT, turns=turns), torch.device("cpu")
    odd = renamed(sampled, tmp_path / "odd.jsonl", lambda cid: f"{cid}#turn1")
    online = Online(peaked_llama, odd, cfg, cpu)
    assert {p.sampled_at for s in ("train", "val") for p in online.items[s]} == {0.8}
    assert online.val_sampled_at == 0.8
    assert Online(peaked_llama, sampled, cfg, cpu, val_data=odd).val_sampled_at == 0.8


def test_an_id_like_a_turns_keeps_its_own_temperature(peaked_llama, sampled, tmp_path):
    """`x` sampled at 0.8 and `x#turn1` at 0.5 in one held-out file: its answers were sampled at two
    temperatures, so nothing replays (rather than replaying `x#turn1` at 0.8)."""
    rows = [json.loads(line) for line in sampled.read_text().splitlines()]
    twin = json.loads(json.dumps(rows[0]))
    twin["id"] = f"{rows[0]['id']}#turn1"
    for m in twin["conversations"]:
        if m["role"] == "assistant":
            m["temperature"] = 0.5
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in [*rows, twin]))
    cpu = torch.device("cpu")
    online = Online(peaked_llama, sampled, EXACT, cpu, val_data=mixed)
    assert {p.seq_id: p.sampled_at for p in online.items["val"]}[twin["id"]] == 0.5
    assert online.val_sampled_at is None
    # Per turn, `x#turn1`'s own turn is `x#turn1#turn1`, as before.
    each = Online(peaked_llama, sampled, dataclasses.replace(EXACT, turns="each"), cpu, val_data=mixed)
    assert {p.seq_id: p.sampled_at for p in each.items["val"]}[f"{twin['id']}#turn1"] == 0.5
    assert each.val_sampled_at is None
