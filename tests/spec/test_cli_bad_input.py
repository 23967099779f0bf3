"""`eval` and `bench verify` input of the wrong kind, refused in one line before any decoding."""

from __future__ import annotations

import pytest

from drafter_lab import cli
from drafter_lab.drafter.checkpoint import save_drafter


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_eval_output_that_is_a_directory(random_llama, prompts_file, tmp_path, capsys, flag):
    """Refused before the decoding's minutes, not by the write after them."""
    assert cli.main(["eval", "--ngram", "--target", str(random_llama), "--prompts", str(prompts_file),
                     flag, str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path}: is a directory: {flag} takes a file to write"


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_eval_output_below_a_file(random_llama, prompts_file, tmp_path, capsys, monkeypatch, flag):
    """A path below a file was found by the write, after the whole decode and its report."""
    from drafter_lab.spec import eval as spec_eval

    def decoded(*a, **k):
        raise AssertionError("decoded before the output was checked")

    monkeypatch.setattr(spec_eval, "evaluate", decoded)
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "x.json"
    assert cli.main(["eval", "--ngram", "--target", str(random_llama), "--prompts", str(prompts_file),
                     flag, str(out)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {out}: {flag} lies below a file, not a directory"


@pytest.mark.parametrize("flag", ["--server", "--baseline-server"])
@pytest.mark.parametrize("url", ["", "notaurl", "localhost:30000"])
def test_eval_server_that_is_no_url(random_llama, prompts_file, capsys, flag, url):
    server = ["--server", "http://127.0.0.1:9"] if flag == "--baseline-server" else []
    with pytest.raises(SystemExit) as e:
        cli.main(["eval", *server, flag, url, "--target", str(random_llama), "--prompts", str(prompts_file)])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().endswith(
        f"argument {flag}: expected a base URL like http://localhost:30000, got {url!r}")


def test_eval_server_target_not_found(prompts_file, tmp_path, capsys):
    """Only the tokenizer is read: a missing directory is not taken for a hub name it cannot reach."""
    missing = tmp_path / "no-such-target"
    assert cli.main(["eval", "--server", "http://127.0.0.1:9", "--target", str(missing),
                     "--prompts", str(prompts_file)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {missing}: model directory not found"


@pytest.mark.parametrize("command", ["eval", "bench"])
def test_a_drafter_given_as_the_target(random_drafter, prompts_file, tmp_path, capsys, command):
    drafter = save_drafter(random_drafter, tmp_path / "drafter")
    args = (["eval", "--ngram", "--target", str(drafter), "--prompts", str(prompts_file)] if command == "eval"
            else ["bench", "verify", "--target", str(drafter), "--tokens", "1", "--batch", "1", "--reps", "1"])
    assert cli.main(args) == 2
    assert capsys.readouterr().err.strip() == \
        f"error: {drafter}: a drafter (LlamaForCausalLMEagle3), not a target model: give the target's own directory"


def test_export_out_below_a_file(random_drafter, tmp_path, capsys):
    drafter = save_drafter(random_drafter, tmp_path / "drafter")
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "export"
    assert cli.main(["export", "--drafter", str(drafter), "--format", "sglang", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {out}: lies below a file, not a directory"


def test_export_verifier_that_is_empty(random_drafter, tmp_path, capsys):
    """It was written into the config: vLLM would be told to serve a model named ""."""
    drafter = save_drafter(random_drafter, tmp_path / "drafter")
    out = tmp_path / "export"
    assert cli.main(["export", "--drafter", str(drafter), "--format", "speculators", "--out", str(out),
                     "--verifier", " "]) == 2
    assert capsys.readouterr().err == "error: --verifier is empty: give the target's name or path, or leave it out\n"
    assert not out.exists()


@pytest.mark.parametrize("top", ["-1", "x"])
def test_vocab_compare_top_that_is_no_row_count(random_drafter, tmp_path, capsys, top):
    """-1 printed every row."""
    drafter = save_drafter(random_drafter, tmp_path / "drafter")
    with pytest.raises(SystemExit) as e:
        cli.main(["vocab", "compare", str(drafter), str(drafter), "--top", top])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"argument --top: expected a number of rows >= 0, got {top!r}")


def test_probe_threads_below_zero(tmp_path, capsys):
    """It was taken as 0, torch's default."""
    assert cli.main(["probe", "--drafter", str(tmp_path), "--target", str(tmp_path), "--data", str(tmp_path),
                     "--threads", "-2"]) == 2
    assert capsys.readouterr().err == "error: --threads must be >= 0 (0: torch's default), got -2\n"


def test_a_target_whose_architecture_merely_says_eagle_is_not_taken_for_a_drafter(tmp_path):
    """NVIDIA's Eagle2 vision-language models are targets."""
    import json

    from drafter_lab.targets.hf import _check_model_dir

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Eagle2ChatModel"]}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    _check_model_dir(tmp_path)


def test_eval_drafter_that_is_a_file_or_missing(random_llama, prompts_file, tmp_path, capsys):
    """A file said "not found"; a missing directory said "config.json is missing"."""
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"")
    for drafter, why in ((file, "is a file, not a drafter directory: give the directory that holds it"),
                         (tmp_path / "none", "drafter checkpoint directory not found")):
        assert cli.main(["eval", "--drafter", str(drafter), "--target", str(random_llama),
                         "--prompts", str(prompts_file)]) == 2
        assert capsys.readouterr().err.strip() == f"error: {drafter}: {why}"
