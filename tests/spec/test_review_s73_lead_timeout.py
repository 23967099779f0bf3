"""Session 73, lead: a library caller's timeout_s is checked as --timeout is, before any request."""

from __future__ import annotations

import pytest

from drafter_lab.data.regenerate_server import ServerConfig
from drafter_lab.data.regenerate_server import check_settings as check_regenerate
from drafter_lab.errors import LabError
from drafter_lab.spec.served import ServedConfig
from drafter_lab.spec.served import check_settings as check_served

BAD = [0, 0.0, -1.0, float("nan"), float("inf"), 2e9, True, "600"]


@pytest.mark.parametrize("timeout", BAD)
def test_a_served_evals_timeout_that_is_no_positive_number_of_seconds_is_one_line(timeout):
    with pytest.raises(LabError) as e:
        check_served(ServedConfig(url="http://127.0.0.1:9", timeout_s=timeout))
    assert str(e.value) == f"timeout_s must be a positive number of seconds (at most 1e9), got {timeout!r}"


@pytest.mark.parametrize("timeout", BAD)
def test_a_server_regenerations_timeout_that_is_no_positive_number_of_seconds_is_one_line(timeout):
    with pytest.raises(LabError) as e:
        check_regenerate(ServerConfig(url="http://127.0.0.1:9", timeout_s=timeout))
    assert str(e.value) == f"timeout_s must be a positive number of seconds (at most 1e9), got {timeout!r}"


@pytest.mark.parametrize("timeout", [1e-3, 1, 600.0, 1e9])
def test_positive_timeouts_up_to_1e9_pass(timeout):
    check_served(ServedConfig(url="http://127.0.0.1:9", timeout_s=timeout))
    check_regenerate(ServerConfig(url="http://127.0.0.1:9", timeout_s=timeout))
