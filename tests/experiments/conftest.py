"""Fixtures of the experiment tests: captured features of the session's random Llama."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest


def _conversations(path: Path, n: int, module: str = "textwrap.py") -> Path:
    lines = [ln for ln in (Path(sysconfig.get_paths()["stdlib"]) / module).read_text().splitlines() if ln.strip()]
    with open(path, "w") as f:
        for i in range(n):
            a = (i * 5) % (len(lines) - 8)
            convo = [{"role": "user", "content": "\n".join(lines[a:a + 2])},
                     {"role": "assistant", "content": "\n".join(lines[a + 2:a + 7])}]
            f.write(json.dumps({"id": f"c{i}", "conversations": convo}) + "\n")
    return path


@pytest.fixture(scope="module")
def features(random_llama, tmp_path_factory) -> Path:
    from drafter_lab.data.capture import prepare_features

    root = tmp_path_factory.mktemp("study-features")
    out = root / "features"
    prepare_features(random_llama, _conversations(root / "convs.jsonl", 40), out, max_length=64,
                     val_fraction=0.25, batch_size=12)
    return out


@pytest.fixture(scope="module")
def held_out(random_llama, tmp_path_factory) -> Path:
    """Features of other conversations (from another stdlib module), both splits a validation set."""
    from drafter_lab.data.capture import prepare_features

    root = tmp_path_factory.mktemp("held-out-features")
    out = root / "features"
    prepare_features(random_llama, _conversations(root / "convs.jsonl", 12, "shlex.py"), out, max_length=64,
                     val_fraction=0.25, batch_size=12)
    return out
