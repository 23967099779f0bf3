"""The CLI builds its parsers without torch, transformers, numpy or safetensors: `--help` and the
light commands (`watch`, `costmodel` without inputs) start in a fraction of a second, and the heavy
imports wait for the command that needs them."""

from __future__ import annotations

import json
import subprocess
import sys

BLOCK = """
import importlib.abc, sys
HEAVY = ("torch", "transformers", "numpy", "safetensors")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in HEAVY:
            raise ImportError(f"{name} imported while the CLI starts")
sys.meta_path.insert(0, Block())
from drafter_lab.cli import build_parser, main
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=120)


def test_every_parser_builds_without_heavy_imports():
    r = _run("p = build_parser(); p.parse_args(['watch', 'a', '--baseline', 'b']); print('built')")
    assert r.returncode == 0 and "built" in r.stdout, r.stderr


def test_watch_runs_without_heavy_imports(tmp_path):
    for name, accs in (("base", (0.5, 0.6, 0.7)), ("run", (0.3, 0.3, 0.3))):
        (tmp_path / name).mkdir()
        rows = [{"split": "val", "step": 10 * (i + 1), "cond_acc_0": a} for i, a in enumerate(accs)]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = _run(f"raise SystemExit(main(['watch', {str(tmp_path / 'run')!r}, '--baseline', {str(tmp_path / 'base')!r}]))")
    assert r.returncode == 3, r.stderr
    assert "stop" in r.stdout and "not closing" in " ".join(r.stdout.split())


def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly():
    """`drafter-lab costmodel | head -1`: a BrokenPipeError traceback at the first print after head left."""
    p = subprocess.Popen([sys.executable, "-m", "drafter_lab", "costmodel"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    p.stdout.close()  # long before the command prints: its imports take far longer
    err = p.stderr.read()
    assert p.wait(timeout=120) == 141 and err == "", err
