"""A run directory whose metrics.jsonl is a directory is refused in one line naming it (an
IsADirectoryError traceback from costmodel --inputs and the watch)."""

from __future__ import annotations

import pytest

from drafter_lab.errors import LabError
from drafter_lab.train.metrics_log import read_metrics


def test_a_metrics_file_that_is_a_directory_is_refused(tmp_path):
    (tmp_path / "metrics.jsonl").mkdir()
    with pytest.raises(LabError, match=f"^{tmp_path / 'metrics.jsonl'}: is a directory, not a metrics file$"):
        read_metrics(tmp_path)
