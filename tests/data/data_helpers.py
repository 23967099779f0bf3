"""Helpers shared by the data tests: the CLI in-process, and conversations from real text."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

from drafter_lab import cli


def clock_at(monkeypatch, day: str) -> None:
    """The clock transformers renders a chat template's `strftime_now` from, at noon of `day`."""
    import datetime

    from transformers.utils import chat_template_utils

    at = datetime.date.fromisoformat(day)

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(at.year, at.month, at.day, 12, tzinfo=tz)

    monkeypatch.setattr(chat_template_utils, "datetime", Frozen)


def run_cli(*args) -> int:
    return cli.main([str(a) for a in args])


def stdlib_lines() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    text = "\n".join(f.read_text(errors="replace") for f in sorted(root.glob("*.py"))[20:30])
    return [ln.strip() for ln in text.splitlines() if len(ln.strip()) > 8]


def make_conversations(n: int) -> list[dict]:
    """n multi-turn chats in both jsonl dialects (SpecForge role/content, ShareGPT from/value)."""
    lines = stdlib_lines()
    rows = []
    for i in range(n):
        a = (i * 11) % (len(lines) - 8)
        turns = [
            ("system", "You explain Python source."),
            ("user", lines[a]),
            ("assistant", " ".join(lines[a + 1 : a + 3])),
            ("user", lines[a + 3]),
            ("assistant", " ".join(lines[a + 4 : a + 6])),
        ][(i % 2) :]  # every other chat has no system turn
        if i % 3 == 0:
            names = {"system": "system", "user": "human", "assistant": "gpt"}
            rows.append({"conversations": [{"from": names[r], "value": c} for r, c in turns]})
        else:
            rows.append({"id": f"chat-{i}", "conversations": [{"role": r, "content": c} for r, c in turns]})
    return rows


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


PREPARE_ARGS = ("--max-length", "256", "--shard-size", "4", "--batch-size", "3", "--val-fraction", "0.25")
