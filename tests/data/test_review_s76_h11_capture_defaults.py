"""Review s76 (h11): the capture defaults are recorded settings (a manifest's max_length, shard_size,
val_fraction, batch_size; a regeneration's temperature, max_new_tokens, batch size and seed), so work made
with no flags resumes under a later version only while they stay as they are; and `data prepare --regenerate`
and `data regenerate` without sampling flags sample alike."""

from __future__ import annotations

from data_helpers import run_cli

from drafter_lab import cli
from drafter_lab.data import commands

DEFAULTS = dict(aux_layer_ids=None, max_length=512, dtype="float32", batch_size=8, shard_size=256, val_fraction=0.1,
                temperature=0.0, max_new_tokens=128, regen_batch_size=16, seed=0, token_exact=False, turns="all",
                chat_template_kwargs=None, tokenize_workers=1, strict=False, device="cpu")


def test_prepare_without_flags_captures_with_the_defaults(tmp_path, monkeypatch):
    from drafter_lab.data import capture

    seen = []
    monkeypatch.setattr(capture, "prepare_features", lambda target, convs, out, cfg: seen.append(cfg))
    monkeypatch.setattr(commands, "_print_manifest", lambda manifest, out: None)
    monkeypatch.chdir(tmp_path)
    assert run_cli("data", "prepare", "--target", "t", "--conversations", "c.jsonl", "--out", "f",
                   "--regenerate") == 0
    [cfg] = seen
    assert {k: getattr(cfg, k) for k in DEFAULTS} == DEFAULTS and cfg.regenerate is True


def test_regenerate_without_flags_samples_as_prepare_does():
    args = cli.build_parser().parse_args(["data", "regenerate", "--conversations", "c.jsonl", "--out", "r.jsonl",
                                          "--target", "t"])
    assert (args.temperature, args.max_new_tokens, args.seed) == (0.0, 128, 0)
    assert (args.batch_size, args.device) == (None, None)  # None: refused with --server, defaulted with --target


def test_a_local_regeneration_without_flags_runs_greedy_in_batches_of_16(random_llama, conversations_file, tmp_path,
                                                                          monkeypatch):
    from drafter_lab.data import regenerate
    from drafter_lab.errors import LabError

    seen = []

    def record(target, convs, journal, **gen):
        seen.append({k: v for k, v in gen.items() if k != "template_kwargs"})
        raise LabError("stop here")

    monkeypatch.setattr(regenerate, "regenerate", record)
    assert run_cli("data", "regenerate", "--conversations", conversations_file, "--out", tmp_path / "r.jsonl",
                   "--target", random_llama) == 2
    assert seen == [dict(temperature=0.0, max_new_tokens=128, batch_size=16, seed=0)]


def test_a_regeneration_that_skipped_nothing_says_nothing_of_skips(tmp_path, monkeypatch, capsys):
    import json

    from drafter_lab.data import regenerate_server

    monkeypatch.setattr(regenerate_server, "regenerate_via_server", lambda convs, source, out, cfg: None)
    src, out = tmp_path / "c.jsonl", tmp_path / "r.jsonl"
    src.write_text(json.dumps({"id": "a", "conversations": [{"role": "user", "content": "hi"}]}) + "\n")
    assert run_cli("data", "regenerate", "--conversations", src, "--out", out, "--server", "http://127.0.0.1:9",
                   "--model", "m") == 0
    said = " ".join(capsys.readouterr().err.split())
    assert "regenerated 1 conversations ->" in said and "skipped" not in said


def test_import_specforge_prints_its_summary_with_the_column_headers(tmp_path, monkeypatch, capsys):
    from drafter_lab.data import specforge
    from drafter_lab.data.shards import Manifest

    manifest = Manifest(target={"fingerprint": "fp"}, aux_layer_ids=[1, 3, 4], dtype="bfloat16", shards={},
                        skipped={})
    monkeypatch.setattr(specforge, "import_specforge", lambda *a, **kw: manifest)
    monkeypatch.chdir(tmp_path)
    assert run_cli("data", "import-specforge", "--hidden-states", "h", "--target", "t", "--out", "f") == 0
    out = capsys.readouterr().out
    assert "features in f (target fp)" in out
    assert [h for h in ("split", "shards", "sequences", "loss tokens") if h not in out] == []
