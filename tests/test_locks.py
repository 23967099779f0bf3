"""building: one builder at a time per cache entry, across real processes; a killed holder frees it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

from drafter_lab import locks

HOLDER = """
import sys
from pathlib import Path
from drafter_lab.locks import building
with building(Path(sys.argv[1]), "entry"):
    print("held", flush=True)
    sys.stdin.readline()
"""


def _holder(path):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _second_builder(path, monkeypatch, build=None):
    """A thread that enters `building(path)` (or runs `build`): (an event set once it logged why it waits,
    one set once it built, the lines it logged, the thread)."""
    logged, waiting, entered = [], threading.Event(), threading.Event()

    def log(line):
        logged.append(line)
        waiting.set()

    monkeypatch.setattr(locks, "log", log)

    def enter():
        if build is not None:
            build()
        else:
            with locks.building(path, "source drafter"):
                pass
        entered.set()

    thread = threading.Thread(target=enter)
    thread.start()
    return waiting, entered, logged, thread


def test_a_second_builder_waits_for_the_first(tmp_path, monkeypatch):
    path = tmp_path / "cache" / "source-drafters" / "abc"
    holder = _holder(path)
    waiting, entered, logged, thread = _second_builder(path, monkeypatch)
    assert waiting.wait(60) and not entered.is_set()  # told why it waits, and waiting
    assert logged == [f"waiting for another run that is building the source drafter ({path})"]
    holder.communicate("done\n")
    thread.join(60)
    assert entered.is_set() and holder.returncode == 0


def test_a_killed_holder_leaves_no_stale_lock(tmp_path, monkeypatch):
    path = tmp_path / "features" / "abc"
    holder = _holder(path)
    waiting, entered, _, thread = _second_builder(path, monkeypatch)
    assert waiting.wait(60)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    holder.stdin.close()
    holder.stdout.close()
    thread.join(60)
    assert entered.is_set()
    with locks.building(path, "features"):  # free again once the second is done
        pass


def test_the_study_captures_a_cache_entry_once_at_a_time(random_llama, tmp_path, monkeypatch):
    """Two studies sharing a cache: the second waits for the first's capture of the same features."""
    from drafter_lab.experiments import study
    from drafter_lab.experiments.config import get_config

    prompts, cache, cfg = tmp_path / "prompts.jsonl", tmp_path / "cache", get_config("smoke")
    prompts.write_text("{}\n")
    captured = []
    monkeypatch.setattr(study, "prepare_features", lambda target, p, out, **settings: captured.append(out))
    out = study._features(random_llama, prompts, cache, cfg)
    holder = _holder(out)
    waiting, entered, _, thread = _second_builder(out, monkeypatch,
                                                  lambda: study._features(random_llama, prompts, cache, cfg))
    assert waiting.wait(60) and not entered.is_set() and captured == [out]
    holder.communicate("done\n")
    thread.join(60)
    assert entered.is_set() and captured == [out, out]
