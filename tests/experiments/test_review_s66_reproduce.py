"""reproduce's comparison: a metric recorded as null against one the other run never wrote."""

from drafter_lab.experiments.reproduce import ABSENT, compare, flat_data


def test_a_null_metric_against_an_absent_one_is_a_difference():
    """Both read as None through dict.get, so a run that stopped writing a metric reproduced "identical"
    to one that wrote it as null."""
    assert compare({"x": None}, {}) == [("x", None, ABSENT)]
    assert compare({}, {"x": None}) == [("x", ABSENT, None)]
    assert compare({"x": None}, {"x": None}) == []


def test_a_data_record_field_null_in_one_manifest_and_absent_in_the_other_differs():
    a = flat_data({"data": {"pair": {"drift": None}}})
    assert compare(a, flat_data({"data": {"pair": {}}})) == [("data / pair / drift", None, ABSENT)]
