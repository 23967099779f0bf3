"""The watch audited again (session 71, helper 2): a verdict file removed between the check and the read is
one line saying so, and a hand-edited position of Infinity or NaN is refused naming the file, not
matched into a NaN gap that reads "behind" (or silently dropped)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.train.watch import WATCH_FILE, stopped_at


def test_a_verdict_removed_as_it_is_read_is_one_line_saying_so(tmp_path, monkeypatch):
    """watch.json there when checked, gone when read (a user's rm): before, the error said nothing after the path."""
    exists = Path.exists
    monkeypatch.setattr(Path, "exists", lambda self, *a, **k: self.name == WATCH_FILE or exists(self, *a, **k))
    with pytest.raises(LabError) as e:
        stopped_at(tmp_path)
    assert str(e.value) == f"{tmp_path / WATCH_FILE}: removed as it was read"


def write_run(run: Path, tokens: list) -> None:
    run.mkdir()
    rows = [{"split": "val", "step": 100 * i, "train_tokens": t, "cond_acc_0": 0.5 if i else 0.0}
            for i, t in enumerate(tokens)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize("run_last, base_last, who", [(INF, INF, "run"), (NAN, 4000, "run"), (4000, INF, "base")])
def test_a_position_of_infinity_or_nan_is_refused_naming_the_file(tmp_path, capsys, run_last, base_last, who):
    """Infinity in both: the baseline interpolated there was NaN, and the NaN gap counted as behind ("stop",
    exit 3, "+nan points"); NaN: that validation was dropped without a word; Infinity in the baseline alone:
    a point the run's validations were interpolated toward."""
    write_run(tmp_path / "run", [0, 1000, 2000, 3000, run_last])
    write_run(tmp_path / "base", [0, 1000, 2000, 3000, base_last])
    code = main(["watch", str(tmp_path / "run"), "--baseline", str(tmp_path / "base"), "--watch-axis", "train_tokens",
                 "--watch-window", "1"])
    err = capsys.readouterr().err.strip()
    bad = json.dumps(run_last if who == "run" else base_last)
    assert code == 2 and len(err.splitlines()) == 1
    assert f"{tmp_path / who}: its validation at step 400 has train_tokens {bad}, not a number" in err
