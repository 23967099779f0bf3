"""A --no-remap transfer never reads the source target's tokenizer: its rows are copied by id, even where the
target the source's run.json names tokenizes otherwise (review s74, h2)."""

from __future__ import annotations

import json
import shutil

from drafter_lab.targets.tokenizer import train_bpe
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train

CFG = TrainConfig(draft_vocab_size=128, batch_size=4, max_steps=1, ttt_steps=1, warmup_steps=0, threads=1)


def test_a_no_remap_transfer_copies_by_id_where_the_source_target_tokenizes_otherwise(tmp_path, peaked_llama,
                                                                                       features):
    train(CFG, peaked_llama, features, tmp_path / "src")
    # The source's target as its run.json names it: the same weights (so the same fingerprint, found), but
    # another tokenizer, so that a remap translates the ids by token.
    twin = tmp_path / "twin"
    shutil.copytree(peaked_llama, twin)
    train_bpe(["def f(x):\n    return x * 2\n" * 50, "class A:\n    pass\n" * 50], 300).save_pretrained(twin)
    record = json.loads((tmp_path / "src" / "run.json").read_text())
    record["target"]["path"] = str(twin)
    (tmp_path / "src" / "run.json").write_text(json.dumps(record))

    train(CFG, peaked_llama, features, tmp_path / "remapped", init_from=tmp_path / "src")
    assert json.loads((tmp_path / "remapped" / "run.json").read_text())["init_from"]["remap_by"] == "token"

    train(CFG, peaked_llama, features, tmp_path / "by_id", init_from=tmp_path / "src", remap=False)
    assert "remap_by" not in json.loads((tmp_path / "by_id" / "run.json").read_text())["init_from"]
    report = json.loads((tmp_path / "by_id" / "transfer.json").read_text())
    assert (report["remap"], report["remap_by"]) == (False, "id")
    assert not any("tokenizers differ" in note for note in report["notes"])
