"""Conversations from real text and features captured through the CLI, for the data tests."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
from data_helpers import PREPARE_ARGS, make_conversations, run_cli, write_jsonl


@contextlib.contextmanager
def one_thread():
    """The models here are tiny: a second intra-op thread adds only sync cost (and stalls a busy machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="session")
def conversations_file(tmp_path_factory) -> Path:
    rows = make_conversations(20)
    rows.insert(5, {"id": "no-answer", "conversations": [{"role": "user", "content": "hello?"}]})
    return write_jsonl(tmp_path_factory.mktemp("convs") / "chats.jsonl", rows)


@pytest.fixture(scope="session")
def features(random_llama, conversations_file, tmp_path_factory) -> Path:
    """Features of the random Llama target, captured through `drafter-lab data prepare`."""
    out = tmp_path_factory.mktemp("features") / "feat"
    with one_thread():
        rc = run_cli("data", "prepare", "--target", random_llama, "--conversations", conversations_file,
                     "--out", out, *PREPARE_ARGS)
    assert rc == 0
    return out
