"""Review s66 (h10): what `data prepare`, `data import-specforge` and `data regenerate --server` hand the work
they start (every flag reaches its setting), and which flags each refuses."""

from __future__ import annotations

import pytest
from data_helpers import run_cli

from drafter_lab.data import commands


@pytest.fixture
def no_summary(monkeypatch):
    monkeypatch.setattr(commands, "_print_manifest", lambda manifest, out: None)


def test_every_prepare_flag_reaches_the_capture_settings(tmp_path, monkeypatch, no_summary):
    from drafter_lab.data import capture

    seen = []
    monkeypatch.setattr(capture, "prepare_features", lambda target, convs, out, cfg: seen.append(cfg))
    monkeypatch.chdir(tmp_path)
    assert run_cli("data", "prepare", "--target", "t", "--conversations", "c.jsonl", "--out", "f", "--regenerate",
                   "--temperature", "0.5", "--max-new-tokens", "7", "--regen-batch-size", "3", "--seed", "9",
                   "--token-exact", "--chat-template-kwargs", '{"x": 1}', "--turns", "each", "--max-length", "77",
                   "--aux-layer-ids", "1,2,3", "--dtype", "bfloat16", "--batch-size", "5", "--shard-size", "11",
                   "--val-fraction", "0.3", "--tokenize-workers", "2", "--strict", "--device", "cuda:1") == 0
    [cfg] = seen
    assert (cfg.regenerate, cfg.temperature, cfg.max_new_tokens, cfg.regen_batch_size, cfg.seed, cfg.token_exact,
            cfg.chat_template_kwargs, cfg.turns, cfg.max_length, cfg.aux_layer_ids, cfg.dtype, cfg.batch_size,
            cfg.shard_size, cfg.val_fraction, cfg.tokenize_workers, cfg.strict, cfg.device) == (
        True, 0.5, 7, 3, 9, True, {"x": 1}, "each", 77, [1, 2, 3], "bfloat16", 5, 11, 0.3, 2, True, "cuda:1")


def test_regen_batch_size_alone_without_regenerate_is_refused(tmp_path, capsys):
    assert run_cli("data", "prepare", "--target", tmp_path / "t", "--conversations", tmp_path / "c.jsonl",
                   "--out", tmp_path / "f", "--regen-batch-size", "2") == 2
    assert capsys.readouterr().err.startswith("error: --regen-batch-size applies with --regenerate (")


def test_import_specforge_hands_over_its_flags(tmp_path, monkeypatch, no_summary):
    from drafter_lab.data import specforge

    seen = []
    monkeypatch.setattr(specforge, "import_specforge", lambda *a, **kw: seen.append((a, kw)))
    monkeypatch.chdir(tmp_path)
    assert run_cli("data", "import-specforge", "--hidden-states", "h", "--target", "t", "--out", "f",
                   "--aux-layer-ids", "0,3,6", "--shard-size", "12", "--val-fraction", "0.2") == 0
    assert seen == [(("h", "t", "f"), {"aux_layer_ids": [0, 3, 6], "val_fraction": 0.2, "shard_size": 12})]


def test_import_specforge_names_the_flag_of_a_bad_shard_size(tmp_path, capsys):
    assert run_cli("data", "import-specforge", "--hidden-states", tmp_path / "h", "--target", tmp_path / "t",
                   "--out", tmp_path / "f", "--shard-size", "0") == 2
    assert capsys.readouterr().err.startswith("error: --shard-size ")


def test_a_server_regeneration_hands_over_its_settings(conversations_file, tmp_path, monkeypatch):
    from drafter_lab.data import regenerate_server

    seen = []
    monkeypatch.setattr(regenerate_server, "regenerate_via_server", lambda convs, source, out, cfg: seen.append(cfg))
    assert run_cli("data", "regenerate", "--conversations", conversations_file, "--out", tmp_path / "r.jsonl",
                   "--server", "http://127.0.0.1:9", "--model", "m", "--concurrency", "3", "--retries", "0",
                   "--timeout", "5", "--temperature", "0.5", "--max-new-tokens", "9", "--seed", "4",
                   "--chat-template-kwargs", '{"enable_thinking": false}') == 0
    [cfg] = seen
    assert (cfg.model, cfg.concurrency, cfg.retries, cfg.timeout_s, cfg.temperature, cfg.max_new_tokens, cfg.seed,
            cfg.chat_template_kwargs) == ("m", 3, 0, 5.0, 0.5, 9, 4, {"enable_thinking": False})


@pytest.mark.parametrize("mode, flags, said", [
    (["--server", "http://127.0.0.1:9"], ["--device", "cpu"], "--device is for --target, not --server"),
    (["--server", "http://127.0.0.1:9"], ["--batch-size", "2", "--device", "cpu"],
     "--batch-size and --device are for --target, not --server"),
    (["--target", "t"], ["--timeout", "5"], "--timeout is for --server, not --target"),
])
def test_a_flag_of_the_other_mode_is_refused(conversations_file, tmp_path, capsys, mode, flags, said):
    assert run_cli("data", "regenerate", "--conversations", conversations_file, "--out", tmp_path / "r.jsonl",
                   *mode, *flags) == 2
    assert capsys.readouterr().err == f"error: {said}\n"


def test_a_regeneration_out_below_a_file_is_refused_before_any_request(conversations_file, tmp_path, monkeypatch,
                                                                       capsys):
    """Else every conversation was generated, and writing the result failed at the end."""
    from drafter_lab.data import regenerate_server

    def no_request(*a, **kw):
        raise AssertionError("a request went out")

    monkeypatch.setattr(regenerate_server, "request_json", no_request)
    (tmp_path / "afile").write_text("mine")
    out = tmp_path / "afile" / "r.jsonl"
    assert run_cli("data", "regenerate", "--conversations", conversations_file, "--out", out, "--server",
                   "http://127.0.0.1:9", "--model", "m") == 2
    assert capsys.readouterr().err == f"error: {out}: --out lies below a file, not a directory\n"


def test_a_file_with_nothing_to_answer_is_refused_naming_it_before_any_request(tmp_path, monkeypatch, capsys):
    import json

    from drafter_lab.data import regenerate_server

    def no_request(*a, **kw):
        raise AssertionError("a request went out")

    monkeypatch.setattr(regenerate_server, "request_json", no_request)
    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps({"id": "a", "conversations": [{"role": "system", "content": "be brief"}]}) + "\n")
    assert run_cli("data", "regenerate", "--conversations", src, "--out", tmp_path / "r.jsonl", "--server",
                   "http://127.0.0.1:9", "--model", "m") == 2
    assert capsys.readouterr().err.startswith(f"error: {src}: no conversation with a user or assistant turn (skipped: ")
    assert not (tmp_path / "r.jsonl").exists()


def test_a_regeneration_says_how_many_it_regenerated_and_what_it_skipped(tmp_path, monkeypatch, capsys):
    import json

    from drafter_lab.data import regenerate_server

    monkeypatch.setattr(regenerate_server, "regenerate_via_server", lambda convs, source, out, cfg: None)
    src, out = tmp_path / "c.jsonl", tmp_path / "r.jsonl"
    rows = [[{"role": "user", "content": "hi"}], [{"role": "system", "content": "be brief"}],
            [{"role": "user", "content": "and you?"}]]
    src.write_text("".join(json.dumps({"id": str(k), "conversations": c}) + "\n" for k, c in enumerate(rows)))
    assert run_cli("data", "regenerate", "--conversations", src, "--out", out, "--server", "http://127.0.0.1:9",
                   "--model", "m") == 0
    said = " ".join(capsys.readouterr().err.split())  # rich may wrap a long path
    assert f"regenerated 2 conversations -> {out} (skipped: {{'no_user_or_assistant_turn': 1}})" in said


def test_a_torchrun_rank_other_than_0_takes_no_lock(tmp_path, monkeypatch, no_summary):
    """Rank 0 alone writes the directory: the others neither check it nor wait on its lock."""
    from drafter_lab import locks
    from drafter_lab.data import capture

    def building(*a, **kw):
        raise AssertionError("a rank other than 0 took the lock")

    monkeypatch.setattr(locks, "building", building)
    monkeypatch.setattr(capture, "prepare_features", lambda *a, **kw: None)
    monkeypatch.setenv("RANK", "1")
    assert run_cli("data", "prepare", "--target", tmp_path / "t", "--conversations", tmp_path / "c.jsonl",
                   "--out", tmp_path / "f") == 0


def test_the_summary_says_none_were_skipped(capsys):
    from drafter_lab.data.shards import Manifest

    manifest = Manifest(target={"fingerprint": "fp"}, aux_layer_ids=[2, 4, 5], dtype="float32", shards={}, skipped={})
    commands._print_manifest(manifest, "feats")
    assert "skipped none" in capsys.readouterr().out
