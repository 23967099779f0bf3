"""Review (s75, h5): a watch verdict names the step >= 0 the watch stopped the run at; a negative one
(an edited watch.json) is refused in one line naming the file, not compared with the run's step."""

from __future__ import annotations

import pytest

from drafter_lab.errors import LabError
from drafter_lab.train.watch import WATCH_FILE, stopped_at


@pytest.mark.parametrize("step", [-1, -300])
def test_a_verdict_at_a_negative_step_is_refused_in_one_line(tmp_path, step):
    (tmp_path / WATCH_FILE).write_text(f'{{"step": {step}}}')
    with pytest.raises(LabError) as e:
        stopped_at(tmp_path)
    assert str(e.value) == (f"{tmp_path / WATCH_FILE}: not the watch's verdict (a JSON object with the step >= 0 "
                            "it stopped at)")


@pytest.mark.parametrize("step", [0, 300])
def test_a_verdict_at_step_zero_or_later_is_read(tmp_path, step):
    (tmp_path / WATCH_FILE).write_text(f'{{"step": {step}}}')
    assert stopped_at(tmp_path) == step
