"""Review s65 of targets/commands.py's drift table: each column shows its own slice's figures, row 0 is
named the embeddings, and the closing line says which model was cached and which built."""

from __future__ import annotations

from drafter_lab.targets.commands import print_drift


def test_each_column_shows_its_slices_figures(capsys):
    def fig(c):
        return {"cka": [c, c / 2], "kl": c + 1, "base_nll": c + 2, "tuned_nll": c + 3, "tokens": 12}

    print_drift({
        "drift": 0.5, "drift_figures": {"all": fig(0.1), "base_text": fig(0.2), "shifted_text": fig(0.3)},
        "build_seconds": {"this_call": 4.5},
        "base": {"fingerprint": "bb", "params": 12345, "cached": True}, "tuned": {"fingerprint": "tt", "cached": False}})
    rows = [" ".join(line.replace("│", " ").split()) for line in capsys.readouterr().out.splitlines()]
    assert any("drift 0.5 (12 held-out tokens)" in r for r in rows)
    assert "0 (embeddings) 0.1000 0.2000 0.3000" in rows
    assert "1 0.0500 0.1000 0.1500" in rows
    assert "KL(base||tuned) 1.1000 1.2000 1.3000" in rows
    assert "tuned NLL 3.1000 3.2000 3.3000" in rows
    assert "base: bb (12,345 params, cached), tuned: tt (built); this call 4.5 s" in rows
