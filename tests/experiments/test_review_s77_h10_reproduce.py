"""Review s77 (h10) of reproduce: compare's absolute floor under a relative tolerance forgives only float
noise around zero, and the numbers compare and flat_data report are floats (the CLI prints them alike)."""

from __future__ import annotations

from drafter_lab.experiments.reproduce import compare, flat_data


def test_a_tolerance_forgives_noise_at_zero_but_not_a_metric_that_left_zero():
    assert compare({"x": 0.0}, {"x": 1e-13}, rel_tol=1e-3) == []
    assert compare({"x": 0.0}, {"x": 0.5}, rel_tol=1e-3) == [("x", 0.0, 0.5)]


def test_an_int_against_a_float_is_compared_and_reported_as_two_floats():
    # the CLI's table prints str(v): both sides read alike ("2.0", "2.5"), not "2" beside "2.5"
    [(key, x, y)] = compare({"n": 2}, {"n": 2.5})
    assert (key, x, y) == ("n", 2.0, 2.5) and type(x) is float
    assert compare({"n": 2}, {"n": 2.0}) == []


def test_flat_data_reads_every_number_as_a_float_but_keeps_flags_and_strings():
    flat = flat_data({"data": {"pair": {"prompts": 3, "lossless": True, "hash": "ab"}}})
    assert flat == {"data / pair / prompts": 3.0, "data / pair / lossless": True, "data / pair / hash": "ab"}
    assert type(flat["data / pair / prompts"]) is float and type(flat["data / pair / lossless"]) is bool
