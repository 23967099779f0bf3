"""The all-reduce benchmark's numbers, mutation audit s66 (h5): the latency table times messages of the
bytes it labels, and the simulator's report (its meta, its flat cost-model file, its printed table)
carries the run's own settings. No ranks are spawned: one rank runs in this process, or `_run` is faked."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from drafter_lab.kernels import bench_allreduce as bar

pytestmark = pytest.mark.skipif(not bar._ext.available(), reason=bar._ext.unavailable_reason() or "extension built")


class _Queue(list):
    put = list.append



def _run_worker(worker, tmp_path, args) -> list:
    """Rank 0 of 1 run in this process (its messages, in order); the worker sets torch's threads: kept here."""
    queue, threads = _Queue(), torch.get_num_threads()
    try:
        worker(0, 1, str(tmp_path / "store"), args, queue)
    finally:
        torch.set_num_threads(threads)
    return queue

def test_the_latency_table_times_messages_of_the_bytes_it_labels(tmp_path, monkeypatch):
    """Each backend's message holds size / itemsize elements of the run's dtype (a float16 row labelled
    1 KB sends 512 halves), timed for `_iters` calls after 20 warm-up ones, and rank 0 reports every
    size of every backend with our backend's algorithm."""
    sent, timed = [], []

    def all_reduce_fn(self, backend, t):
        sent.append((backend, t.dtype, t.numel() * t.element_size()))
        return lambda: None

    def median_us(group, backend, fn, iters, warmup):
        timed.append((backend, iters, warmup))
        return 1.5

    monkeypatch.setattr(bar._Group, "all_reduce_fn", all_reduce_fn)
    monkeypatch.setattr(bar, "_median_us", median_us)
    sizes = [2, 1024, 1 << 20]
    args = argparse.Namespace(backends=["cpu", "gloo"], sizes=sizes, dtype="float16", iters=2000, timeout=30.0)
    queue = _run_worker(bar._latency_worker, tmp_path, args)
    assert sent == [(b, torch.float16, s) for s in sizes for b in ("cpu", "gloo")]
    assert timed == [(b, n, 20) for n in (2000, 2000, 125) for b in ("cpu", "gloo")]
    assert queue[:3] == [("progress", s) for s in sizes]
    assert queue[3] == ("done", {b: dict.fromkeys(sizes, 1.5) for b in ("cpu", "gloo")},
                        {"cpu": dict.fromkeys(sizes, "1-shot")})


def test_a_latency_is_the_median_of_the_timed_calls_in_microseconds(monkeypatch):
    """The warm-up calls run untimed, then each timed call is one sample: the clock (ns) is faked so
    the samples are 4, 6 and 9 us."""
    calls = []
    clock = iter([0, 4000, 10_000, 16_000, 20_000, 29_000])
    monkeypatch.setattr(bar.time, "perf_counter_ns", lambda: next(clock))
    monkeypatch.setattr(bar.dist, "barrier", lambda: calls.append("barrier"))
    group = argparse.Namespace(sync=lambda backend: calls.append("sync"))
    assert bar._median_us(group, "cpu", lambda: calls.append("call"), iters=3, warmup=2) == 6.0
    assert calls == ["call", "call", "sync", "barrier"] + ["call", "sync"] * 3


def _max_worker(rank, world, store_path, args, queue):
    """Spawned rank (module level, so the child imports it): the bookkeeping group's max over ranks."""
    group = bar._Group(rank, world, store_path, [], 30.0)
    got = group.max_over_ranks([rank + 1.0, 10.0 - rank])
    if rank == 0:
        queue.put(("done", got))
    group.close()


def test_the_reported_latency_is_the_slowest_ranks():
    """Each number in the table and the JSON is the max over ranks of their medians, not their sum."""
    (got,) = bar._run(_max_worker, 2, argparse.Namespace(), 0, "test")
    assert got == [2.0, 10.0]


def test_the_simulator_report_carries_the_runs_settings(tmp_path, monkeypatch, capsys):
    """`--tp-sim` runs at the first of --ranks and writes its settings into the report's meta, and each
    backend's flat file keyed by the message bytes of its dtype."""
    calls = []
    ar = {"cpu": {1 * bar.HIDDEN * 2: 11.0, 3 * bar.HIDDEN * 2: 13.0}}
    vm = {b: {1: 2.0, 3: 4.0} for b in ("none", "cpu")}

    def fake_run(worker, world, args, total, what):
        calls.append((worker, world, args.backends, total))
        return ar, vm

    monkeypatch.setattr(bar, "_run", fake_run)
    out = tmp_path / "sim.json"
    argv = ["--tp-sim", "--ranks", "3", "4", "--backends", "cpu", "--dtype", "float16", "--layers", "7",
            "--inner", "16", "--tokens", "1", "3", "--iters", "9", "--sim-reps", "2", "--json", str(out)]
    assert bar.main(argv) == 0
    assert calls == [(bar._tp_sim_worker, 3, ["cpu"], 2)]
    report = json.loads(out.read_text())
    meta = {k: report["meta"][k] for k in ("ranks", "layers", "allreduces_per_step", "hidden", "inner", "tokens",
                                           "dtype", "iters", "sim_reps")}
    assert meta == {"ranks": 3, "layers": 7, "allreduces_per_step": 14, "hidden": bar.HIDDEN, "inner": 16,
                    "tokens": [1, 3], "dtype": "float16", "iters": 9, "sim_reps": 2}
    assert report["allreduce_us"] == {"cpu": {"14336": 11.0, "43008": 13.0}}
    assert report["verify_ms"] == {b: {"1": 2.0, "3": 4.0} for b in ("none", "cpu")}
    assert json.loads((tmp_path / "sim.costmodel-cpu.json").read_text()) == {"allreduce_us": {"14336": 11.0, "43008": 13.0}}
    text = capsys.readouterr().out
    assert "3 ranks, 7 layers x 2 all-reduces, hidden 7168, float16" in text
    rows = [line.split() for line in text.splitlines() if line.split()[:2] in (["1", "14336"], ["3", "43008"])]
    assert rows == [["1", "14336", "2.00", "2.00", "11.0"], ["3", "43008", "4.00", "4.00", "13.0"]]


def test_the_simulator_writes_its_default_report_without_json(tmp_path, monkeypatch):
    """Without --json the report goes to runs/bench/allreduce_tp_sim.json (from where it runs), its flat
    file beside it."""
    monkeypatch.setattr(bar, "_run", lambda worker, world, args, total, what: ({"cpu": {14336: 9.0}},
                                                                              {b: {1: 1.0} for b in ("none", "cpu")}))
    monkeypatch.chdir(tmp_path)
    assert bar.main(["--tp-sim", "--backends", "cpu", "--tokens", "1"]) == 0
    report = json.loads((tmp_path / bar.DEFAULT_JSON).read_text())
    assert report["allreduce_us"] == {"cpu": {"14336": 9.0}} and report["meta"]["ranks"] == 2
    flat = (tmp_path / bar.DEFAULT_JSON).with_name("allreduce_tp_sim.costmodel-cpu.json")
    assert json.loads(flat.read_text()) == {"allreduce_us": {"14336": 9.0}}


def test_a_simulator_rank_reports_latencies_and_steps_under_their_own_keys(tmp_path, monkeypatch):
    """Rank 0's message: each backend's all-reduce latency by message bytes, and each backend's (and
    "none"'s) verify step by tokens, from one max over ranks of both lists; every backend's step runs
    once untimed, then --sim-reps times."""
    steps = []
    monkeypatch.setattr(bar, "_median_us", lambda group, backend, fn, iters, warmup: 7.0)
    monkeypatch.setattr(bar, "_verify_step", lambda group, b, x, residual, weights, norm_w, layers: steps.append((b, layers)))
    monkeypatch.setattr(bar.statistics, "median", lambda samples: 250.0 + len(samples))
    args = argparse.Namespace(backends=["cpu"], tokens=[1, 2], dtype="bfloat16", iters=5, inner=4, layers=3,
                              sim_reps=2, timeout=30.0)
    queue = _run_worker(bar._tp_sim_worker, tmp_path, args)
    assert steps == [(b, 3) for _ in range(2 * 3) for b in ("none", "cpu")]
    assert queue == [("progress", 1), ("progress", 2),
                     ("done", {"cpu": {bar.HIDDEN * 2: 7.0, 2 * bar.HIDDEN * 2: 7.0}},
                      {b: {1: 252.0, 2: 252.0} for b in ("none", "cpu")})]


def test_the_latency_table_refuses_an_unwritable_json_before_timing(tmp_path, monkeypatch):
    """--json given to the latency table is checked before its minutes of timing, as --tp-sim's is."""
    from drafter_lab.errors import LabError

    monkeypatch.setattr(bar, "latency_table", lambda args: pytest.fail("timed before refusing --json"))
    (tmp_path / "report.json").mkdir()
    with pytest.raises(LabError, match="is a directory: --json takes a file to write"):
        bar.main(["--backends", "cpu", "--json", str(tmp_path / "report.json")])


def test_the_rank_limit_is_inclusive_and_an_endless_timeout_is_refused(monkeypatch):
    """16 ranks is the segment's room (taken); --timeout inf would let a dead rank hang the run (refused)."""
    from drafter_lab.errors import LabError

    seen = []
    monkeypatch.setattr(bar, "latency_table", seen.append)
    assert bar.main(["--backends", "cpu", "--ranks", "2", str(bar.MAX_RANKS), "--sizes", "1024"]) == 0
    assert seen[0].ranks == [2, 16]
    with pytest.raises(LabError, match="^--timeout must be a positive number of seconds, got inf$"):
        bar.main(["--backends", "cpu", "--timeout", "inf"])
