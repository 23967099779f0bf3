"""Review s59: a server answer that is not UTF-8, a lock for `--out .`, a directory write over the current directory."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from drafter_lab import httpjson, locks
from drafter_lab.errors import LabError


@pytest.fixture
def answering():
    """(URL, bodies): each POST is answered 200 with the next of `bodies`."""
    bodies: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = bodies.pop(0)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/x", bodies
    httpd.shutdown()
    httpd.server_close()


def test_an_answer_that_is_not_utf8_is_one_line(answering):
    """A proxy's Latin-1 page, or an event with such bytes, was a UnicodeDecodeError traceback."""
    url, bodies = answering
    bodies += [b"<html>caf\xe9</html>", b'data: {"t": "caf\xe9"}\n\ndata: [DONE]\n\n']
    with pytest.raises(LabError, match=rf"^{url}: server answer is not JSON$"):
        httpjson.request_json(url, {})
    with pytest.raises(LabError, match=rf"^{url}: server sent an event that is not JSON: "):
        list(httpjson.stream_json(url, {}))


def test_out_dot_is_locked_as_its_directory(tmp_path, monkeypatch):
    """`data prepare --out .` (or import-specforge's) was pathlib's "empty name" ValueError; the lock
    is the one the directory's full path takes, so the two spellings exclude each other."""
    entry = tmp_path / "features"
    entry.mkdir()
    monkeypatch.chdir(entry)
    with locks.building(entry, "feature directory"):
        with pytest.raises(LabError, match="another run is using the feature directory"):
            with locks.building(locks.Path("."), "feature directory", wait=False):
                pass
    with locks.building(locks.Path("."), "feature directory", wait=False):
        pass
    assert (tmp_path / ".features.lock").is_file()


def test_a_directory_write_over_the_current_directory_is_one_line(tmp_path, monkeypatch):
    """`export --out .` was pathlib's ValueError ('.' has no name); `--out $PWD`, or a parent of it, swapped
    the current directory away and left the shell in a deleted one."""
    from drafter_lab.atomic import atomic_dir

    here = tmp_path / "out" / "inner"
    here.mkdir(parents=True)
    monkeypatch.chdir(here)
    for path in (".", here, tmp_path / "out"):
        with pytest.raises(LabError, match="is \\(or holds\\) the current directory"):
            with atomic_dir(path):
                pass
    assert here.is_dir() and Path.cwd() == here
    with atomic_dir("sub") as tmp:  # below it, written as before
        (tmp / "f").write_text("x")
    assert (here / "sub" / "f").read_text() == "x"
