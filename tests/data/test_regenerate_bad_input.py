"""`data regenerate` settings and paths refused in one line before the target loads or a request goes out."""

from __future__ import annotations

import pytest
from data_helpers import run_cli


@pytest.mark.parametrize("flag,value,said", [
    ("--max-new-tokens", "0", "--max-new-tokens must be at least 1, got 0"),
    ("--batch-size", "0", "--batch-size must be at least 1, got 0"),
    ("--temperature", "nan", "--temperature must be a finite number >= 0, got nan"),
    ("--temperature", "-1", "--temperature must be a finite number >= 0, got -1.0"),
])
def test_local_settings(random_llama, conversations_file, tmp_path, capsys, flag, value, said):
    out = tmp_path / "regen.jsonl"
    assert run_cli("data", "regenerate", "--conversations", conversations_file, "--out", out, "--target", random_llama,
                   flag, value) == 2
    assert capsys.readouterr().err.strip() == f"error: {said}"
    assert not out.exists()


@pytest.mark.parametrize("flag,value,said", [("--retries", "-1", "--retries must be >= 0, got -1"),
                                             ("--temperature", "nan", "--temperature must be a finite number >= 0, got nan")])
def test_server_settings(conversations_file, tmp_path, capsys, flag, value, said):
    """Refused before the first request: retries -1 retried a refused connection forever."""
    assert run_cli("data", "regenerate", "--conversations", conversations_file, "--out", tmp_path / "regen.jsonl",
                   "--server", "http://127.0.0.1:9", "--model", "m", "--retries", "0", flag, value) == 2
    assert capsys.readouterr().err.strip() == f"error: {said}"


@pytest.mark.parametrize("url", ["", "localhost:30000", "notaurl"])
def test_server_that_is_no_url(conversations_file, tmp_path, capsys, url):
    with pytest.raises(SystemExit) as e:
        run_cli("data", "regenerate", "--conversations", conversations_file, "--out", tmp_path / "regen.jsonl",
                "--server", url)
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().endswith(
        f"argument --server: expected a base URL like http://localhost:30000, got {url!r}")


def test_out_that_is_the_conversations_file(random_llama, conversations_file, tmp_path, capsys):
    convs = tmp_path / "chats.jsonl"
    convs.write_bytes(conversations_file.read_bytes())
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "." / "chats.jsonl",
                   "--target", random_llama, "--max-new-tokens", "2") == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {tmp_path / 'chats.jsonl'}: --out is the --conversations file: the regenerated turns would replace "
        "the recorded ones; choose another --out")
    assert convs.read_bytes() == conversations_file.read_bytes()


@pytest.mark.parametrize("mode, flags, message", [
    ("--target", ["--concurrency", "4"], "--concurrency is for --server, not --target"),
    ("--target", ["--retries", "0", "--model", "m"], "--model and --retries are for --server, not --target"),
    ("--server", ["--batch-size", "4"], "--batch-size is for --target, not --server"),
    ("--server", ["--device", "cuda"], "--device is for --target, not --server"),
])
def test_a_flag_of_the_other_mode_is_refused(random_llama, conversations_file, tmp_path, capsys, mode, flags,
                                            message):
    """It was ignored without a word: the run was not the one asked for."""
    who = random_llama if mode == "--target" else "http://127.0.0.1:9"
    assert run_cli("data", "regenerate", "--conversations", conversations_file, "--out", tmp_path / "r.jsonl", mode,
                   who, *flags) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
