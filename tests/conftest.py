"""Shared fixtures: a real (randomly initialised) HF Llama target with a real trained tokenizer."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sysconfig
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch


def stdlib_texts(n_files: int = 12) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))[:n_files]
    return [f.read_text(errors="replace") for f in files]


@pytest.fixture(scope="session")
def require_draft_step_op():
    """`require(device)` skips without a built draft_step kernel for `device`; under CI its absence
    fails the test. A fixture, not an import: several test folders have a module named conftest."""
    from drafter_lab.kernels import draft_step

    def require(device: str) -> None:
        if draft_step.available(device):
            return
        msg = f"drafter_lab._C has no {device} kernel for draft_step (build with pip install -e .)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)

    return require


def make_random_llama(out: Path, vocab_texts=None, *, hidden=64, layers=8, heads=4, kv_heads=2, vocab=512, seed=0):
    """Write a random LlamaForCausalLM (GQA) plus a trained byte-level BPE with save_pretrained."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from drafter_lab.targets.tokenizer import train_bpe

    tok = train_bpe(vocab_texts or stdlib_texts(), vocab)
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=1024,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def llama_maker():
    """make_random_llama, for a test that needs a target of another shape (a fixture: see above)."""
    return make_random_llama


def write_stdlib_conversations(path: Path, n: int, module: str = "textwrap.py") -> Path:
    """`n` chats of a stdlib module's source, 5 lines apart: two lines asked, the next five answered."""
    lines = [ln for ln in (Path(sysconfig.get_paths()["stdlib"]) / module).read_text().splitlines() if ln.strip()]
    with open(path, "w") as f:
        for i in range(n):
            a = (i * 5) % (len(lines) - 8)
            convo = [{"role": "user", "content": "\n".join(lines[a:a + 2])},
                     {"role": "assistant", "content": "\n".join(lines[a + 2:a + 7])}]
            f.write(json.dumps({"id": f"c{i}", "conversations": convo}) + "\n")
    return path


@pytest.fixture(scope="session")
def conversations_writer():
    """write_stdlib_conversations, for a test that captures its own features (a fixture: see above)."""
    return write_stdlib_conversations


@pytest.fixture(scope="session")
def stdlib_features(random_llama, tmp_path_factory) -> Path:
    """Features of 24 chats of stdlib source (write_stdlib_conversations) captured from random_llama."""
    from drafter_lab.data.capture import prepare_features

    root = tmp_path_factory.mktemp("stdlib_features")
    prepare_features(random_llama, write_stdlib_conversations(root / "convs.jsonl", 24), root / "features",
                     max_length=64, val_fraction=0.25, batch_size=16)
    return root / "features"


@pytest.fixture(scope="session")
def random_llama(tmp_path_factory) -> Path:
    """A random 8-layer GQA Llama written with save_pretrained: "any HF target" in tests."""
    return make_random_llama(tmp_path_factory.mktemp("random_llama") / "model")


@pytest.fixture(scope="session")
def wide_llama(tmp_path_factory) -> Path:
    """A random Llama whose drafter the CUDA draft-step kernels take (head_dim 128, hidden 256)."""
    return make_random_llama(tmp_path_factory.mktemp("wide_llama") / "model", hidden=256, heads=2, kv_heads=1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none is visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cli_error(capsys):
    """Run the CLI on argv, expecting a refusal: exit 2 and one line on stderr, which it returns."""
    from drafter_lab import cli

    def run(argv) -> str:
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        return err.strip()

    return run


@pytest.fixture
def foreign_source_target(random_llama, tmp_path) -> tuple[Path, Path]:
    """(drafter, other): a drafter directory whose run.json records `random_llama`, and a copy of that target
    with another config, so another fingerprint: a --source-target that is not the drafter's."""
    from drafter_lab.targets.fingerprint import fingerprint

    other = tmp_path / "other"
    shutil.copytree(random_llama, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5 + config["rms_norm_eps"]}))
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "run.json").write_text(json.dumps({"target": {"path": str(random_llama),
                                                             "fingerprint": fingerprint(random_llama)}}))
    return drafter, other


@pytest.fixture
def http_server():
    """serve(Handler) -> base URL: a threading HTTP server on a free local port for a test's handler class
    (its log_message silenced), shut down when the test ends."""
    servers: list[ThreadingHTTPServer] = []

    def serve(handler: type[BaseHTTPRequestHandler]) -> str:
        handler.log_message = lambda self, *args: None
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        servers.append(httpd)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield serve
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def raw_server():
    """start(answer) -> (base URL, requests it got): a socket server that reads each request, sends
    `answer`'s bytes (None: nothing) and holds the connection open until the test ends, as a hung engine."""
    listeners: list[socket.socket] = []
    held: list[socket.socket] = []

    def start(answer: bytes | None = None) -> tuple[str, list[bytes]]:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)
        got: list[bytes] = []

        def serve():
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:  # closed: the test ended
                    return
                held.append(conn)
                got.append(conn.recv(65536))
                if answer is not None:
                    conn.sendall(answer)

        threading.Thread(target=serve, daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}", got

    yield start
    for sock in listeners + held:
        sock.close()


@pytest.fixture
def shut_out():
    """A world-readable scratch directory, and a context that runs its body as a user that file modes keep
    out: root passes any mode, so as root the body takes the effective uid of `nobody`, given back after
    (not tmp_path: its 0700 parents would keep `nobody` out of everything under it)."""
    scratch = tempfile.TemporaryDirectory()
    os.chmod(scratch.name, 0o755)

    @contextlib.contextmanager
    def as_nobody():
        if os.geteuid() != 0:
            yield
            return
        try:
            os.seteuid(65534)
        except PermissionError:
            pytest.skip("root here may not take another uid")
        try:
            yield
        finally:
            os.seteuid(0)

    yield Path(scratch.name), as_nobody
    scratch.cleanup()
