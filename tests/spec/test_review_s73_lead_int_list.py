"""Session 73, lead: a sweepable flag's value given twice is one setting, in the order first given."""

from __future__ import annotations

from drafter_lab.spec import bench_verify
from drafter_lab.spec.commands import int_list


def test_a_value_given_twice_is_kept_once_where_first_given():
    assert int_list("4,1,4,16,1") == [4, 1, 16]


def test_bench_verify_times_each_batch_and_token_count_once():
    args = bench_verify.parse(["--target", "t", "--device", "cpu", "--batch", "1,1,4", "--tokens", "2,2"])
    assert (args.batch, args.tokens) == ([1, 4], [1, 2])  # the decode step (T=1) first, as always
