"""CLI review (s59): a pilot transfer rate the pilot's arms refuse is refused before the probe's signals."""

from __future__ import annotations

import pytest

from drafter_lab.cli import main


@pytest.mark.parametrize("scale", ["-1", "nan", "inf"])
def test_a_bad_transfer_lr_scale_is_refused_before_the_probe_runs(tmp_path, capsys, monkeypatch, scale):
    """It was refused by the pilot's first arm, after the zero-shot, home and CKA minutes (and named l2sp,
    which the probe has none of); with --pilot-steps 0 it was taken silently."""
    from drafter_lab.experiments import probe as probe_mod

    monkeypatch.setattr(probe_mod, "probe", lambda *a, **k: pytest.fail("the probe ran"))
    for pilot in ("48", "0"):
        argv = ["probe", "--drafter", "d", "--target", "t", "--data", "f", "--pilot-steps", pilot,
                "--transfer-lr-scale", scale]
        assert main(argv) == 2
        assert capsys.readouterr().err == f"error: --transfer-lr-scale must be >= 0 and finite, got {float(scale)}\n"
