"""Bad input to the benchmarks (and the outputs and thread counts they share with other commands):
one line `error: ...` and exit code 2, found before the minutes of work, not a traceback after them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from drafter_lab import atomic
from drafter_lab.cli import main as cli
from drafter_lab.errors import LabError
from drafter_lab.kernels import bench_allreduce as bar
from drafter_lab.kernels import bench_draft_forward as bdf
from drafter_lab.threads import torch_threads

proc = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs procfs, which takes no new file")
TOO_MANY = 4 * (os.cpu_count() or 1) + 1


@pytest.fixture
def no_work(monkeypatch):
    """Each benchmark's work, which a refused input must never reach."""
    def ran(*_, **__):
        raise AssertionError("the benchmark ran")

    monkeypatch.setattr(bar, "tp_sim", ran)
    monkeypatch.setattr(bar, "latency_table", ran)
    monkeypatch.setattr(bdf, "bench_shape", ran)


@pytest.fixture
def threads_kept(monkeypatch):
    """torch.set_num_threads recorded, not applied: a count it was given must not reach OpenMP here."""
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    return calls


@proc
def test_a_write_where_no_file_can_be_made_is_one_line(tmp_path):
    """mkstemp's and mkdir's FileNotFoundError (procfs) was the traceback."""
    with pytest.raises(LabError, match=r"^/proc/x\.json: cannot write a file here: "):
        atomic.write_json("/proc/x.json", {})
    with pytest.raises(LabError, match=r"^/proc/nodir/x\.json: cannot create its directory: "):
        atomic.write_json("/proc/nodir/x.json", {})
    with pytest.raises(LabError, match=r"^/proc/xdir: cannot write a directory here: "):
        with atomic.atomic_dir("/proc/xdir"):
            pass


@proc
def test_costmodel_json_where_no_file_can_be_made(capsys):
    assert cli(["costmodel", "--json", "/proc/x.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: /proc/x.json: --json: cannot write a file in /proc: ") and err.count("\n") == 1


def _outputs(tmp_path: Path) -> list[tuple[str, str]]:
    (tmp_path / "file").write_text("")
    cases = [(str(tmp_path), "is a directory: {flag} takes a file to write"),
             (str(tmp_path / "file" / "x.json"), "{flag} lies below a file, not a directory")]
    if Path("/proc/self").is_dir():
        cases.append(("/proc/x.json", "{flag}: cannot write a file in /proc: "))
    return cases


@pytest.mark.parametrize("bench", [
    ["bench", "verify", "--target", "{tmp}/no-target", "--json"],
    ["bench", "allreduce", "--tp-sim", "--ranks", "2", "--iters", "2", "--backends", "cpu", "--json"],
    ["bench", "draft-forward", "--device", "cpu", "--shapes", "tiny", "--json"],
    ["bench", "draft-forward", "--device", "cpu", "--shapes", "tiny", "--markdown"],
])
def test_bench_output_that_cannot_be_written_is_refused_before_the_work(bench, tmp_path, capsys, no_work):
    """A directory, a path below a file or one where no file can be made was found only by the write
    after the whole benchmark (or, for verify, after loading a target that is not even there)."""
    if bench[1] == "allreduce" and not bar._ext.available():
        pytest.skip(bar._ext.unavailable_reason())
    argv = [a.replace("{tmp}", str(tmp_path)) for a in bench]
    for out, problem in _outputs(tmp_path):
        assert cli([*argv, out]) == 2
        assert capsys.readouterr().err.startswith(f"error: {out}: {problem.format(flag=argv[-1])}")


def test_torch_threads_past_four_per_cpu(threads_kept):
    """torch takes any count; OpenMP then starts that many threads at the first op, and the process
    segfaults when they run out."""
    with pytest.raises(LabError, match=f"^threads must be at most {TOO_MANY - 1} \\(4 per CPU\\), got {TOO_MANY}$"):
        with torch_threads(TOO_MANY):
            pass
    assert threads_kept == []


def test_bench_verify_threads_past_four_per_cpu(tmp_path, capsys, threads_kept):
    """Was `error: <target>: cannot load model: can't start new thread`, then a segfault (exit 139)."""
    assert cli(["bench", "verify", "--target", str(tmp_path / "no-target"), "--threads", str(TOO_MANY)]) == 2
    assert capsys.readouterr().err == f"error: --threads must be at most {TOO_MANY - 1} (4 per CPU), got {TOO_MANY}\n"
    assert threads_kept == []


def test_eval_and_probe_threads_past_four_per_cpu(tmp_path, capsys, threads_kept, monkeypatch):
    import drafter_lab.experiments.probe

    monkeypatch.setattr(drafter_lab.experiments.probe, "probe", lambda *_, **__: pytest.fail("the probe ran"))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "conversations": [{"role": "user", "content": "hi"},
                                                            {"role": "assistant", "content": "hello"}]}) + "\n")
    none = str(tmp_path / "none")
    for argv in (["eval", "--ngram", "--target", none, "--prompts", str(prompts)],
                 ["probe", "--drafter", none, "--target", none, "--data", none]):
        assert cli([*argv, "--threads", str(TOO_MANY)]) == 2
        assert capsys.readouterr().err == f"error: --threads must be at most {TOO_MANY - 1} (4 per CPU), got {TOO_MANY}\n"
    assert threads_kept == []


def test_draft_forward_context_past_the_memory(capsys, no_work, monkeypatch):
    """Was the allocator's traceback (or, with room for each cache but not for all, the OOM killer)."""
    monkeypatch.setattr(bdf, "host_available_bytes", lambda: 10**9, raising=False)
    assert cli(["bench", "draft-forward", "--device", "cpu", "--shapes", "tiny", "--batch", "1",
                "--context", "100000000", "--compile-mode", "none"]) == 2
    # 4 copies x 2 step inputs x k and v x 2 kv heads x (1e8 + 1) positions x 64 x 4 bytes, and the weights
    assert capsys.readouterr().err == ("error: --context 100000000: 4 copies of tiny at batch 1 need 819.2 GB for "
                                       "weights and KV caches, more than the 1.0 GB free on cpu\n")
    monkeypatch.setattr(bdf, "bench_shape", lambda *_: [])  # the defaults fit
    assert bdf.main(["--device", "cpu", "--shapes", "tiny", "--reps", "1", "--warmup", "0"]) == 0


@pytest.mark.skipif(not bar._ext.available(), reason=bar._ext.unavailable_reason() or "extension built")
def test_allreduce_sizes_past_the_memory(capsys, no_work, monkeypatch):
    """Each rank printed its allocator's traceback, then `benchmark ranks failed`."""
    monkeypatch.setattr(bar, "host_available_bytes", lambda: 10**9, raising=False)
    assert cli(["bench", "allreduce", "--sizes", "200000000", "--ranks", "2", "--iters", "2", "--backends", "cpu"]) == 2
    # each rank: the 200 MB bfloat16 message and its 400 MB float32 draw
    assert capsys.readouterr().err == ("error: --sizes 200000000: 2 ranks drawing the message in float32 need 1.2 GB, "
                                       "more than the 1.0 GB of memory available\n")
    with pytest.raises(AssertionError, match="the benchmark ran"):  # the default sizes fit
        bar.main(["--ranks", "2", "--backends", "cpu"])
