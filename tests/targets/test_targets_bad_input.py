"""`targets build` settings and paths that would fail mid-build, or build something else, refused first."""

from __future__ import annotations

import pytest

from drafter_lab import cli


@pytest.mark.parametrize("flag,value,says", [
    ("--threads", "-1", "--threads must be >= 0 and finite, got -1"),
    ("--hidden-size", "0", "--hidden-size must be >= 1, got 0"),
    ("--num-kv-heads", "0", "--num-kv-heads must be >= 1, got 0"),
    ("--batch-size", "0", "--batch-size must be >= 1, got 0"),
    ("--base-lr", "nan", "--base-lr must be >= 0 and finite, got nan"),
    ("--base-steps", "-1", "--base-steps must be >= 0 and finite, got -1"),
    ("--drift", "inf", "--drift must be >= 0 and finite, got inf"),  # the command's own option, applied by build_pair
    ("--drift-conversations", "0", "--drift-conversations must be >= 1, got 0"),
    # the trainer made its smallest vocabulary instead, and the build exited 0
    ("--vocab-size", "0", "--vocab-size must be >= 259 (the 256 bytes and the special tokens), got 0"),
])
def test_nonsense_settings_are_one_line(tmp_path, capsys, flag, value, says):
    out = tmp_path / "pair"
    assert cli.main(["targets", "build", "--preset", "micro", "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
                     flag, value]) == 2
    assert capsys.readouterr().err.strip() == f"error: {says}"
    assert not out.exists()


def test_cache_dir_that_is_a_file(tmp_path, capsys):
    cache = tmp_path / "cache"
    cache.write_text("")
    assert cli.main(["targets", "build", "--preset", "micro", "--out", str(tmp_path / "pair"),
                     "--cache-dir", str(cache)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {cache}/") and err.endswith(": lies below a file, not a directory")


def test_the_smallest_vocab_is_the_tokenizers():
    from drafter_lab.targets.presets import SMALLEST_VOCAB
    from drafter_lab.targets.tokenizer import SPECIAL_TOKENS, train_bpe

    assert len(train_bpe(["a b"], 1)) == SMALLEST_VOCAB == 256 + len(SPECIAL_TOKENS)


def test_a_model_directory_without_a_tokenizer_says_what_is_missing(tmp_path, capsys):
    """Named before transformers is asked: its answer was a paragraph on converting slow tokenizers."""
    from transformers import LlamaConfig

    d = tmp_path / "no-tokenizer"
    LlamaConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                vocab_size=32).save_pretrained(d)
    from drafter_lab.errors import LabError
    from drafter_lab.targets.hf import load_tokenizer

    with pytest.raises(LabError) as e:
        load_tokenizer(d)
    assert str(e.value) == (f"{d}: no tokenizer files (tokenizer.json, tokenizer_config.json, tokenizer.model, "
                            "vocab.json, ...): give the model's own directory, which holds its tokenizer")


def test_a_message_whose_first_line_introduces_a_list_keeps_the_list():
    """transformers' tokenizer message is a list introduced by a colon: its first line alone ended on 'from one of:'."""
    from drafter_lab.targets.hf import first_line

    e = ValueError("Couldn't instantiate the backend tokenizer from one of:\n(1) a file, (2) a slow tokenizer\n\nmore")
    assert first_line(e) == "Couldn't instantiate the backend tokenizer from one of: (1) a file, (2) a slow tokenizer more"
    assert first_line(ValueError("one line\nand the next")) == "one line"
