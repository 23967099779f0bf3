"""A sweep's settings refused before the first one decodes, and a cost-inputs deployment's all-reduce count
that is no integer (session 69, h3)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from drafter_lab.errors import LabError
from drafter_lab.journal import Journal
from drafter_lab.spec import engine as spec_engine
from drafter_lab.spec.costinputs import accept_by_steps, apply_inputs
from drafter_lab.spec.costmodel import PRESETS
from drafter_lab.spec.sweep import grid, run_sweep

SEEDS = "seeds-kimi-k2.5-8x-pcie"


def test_a_chains_draft_tokens_list_is_refused_naming_the_flags():
    """A chain verifies its own steps: --draft-tokens with chains alone is refused by the flags (a sweep's
    rows dropped the list), unless it only repeats the steps."""
    assert grid([4], [1], [4]) == [{"steps": 4, "topk": 1, "draft_tokens": 4, "batch": 1}]
    with pytest.raises(LabError) as e:
        grid([4], [1], [8])
    assert str(e.value) == ("a chain verifies the 4 tokens it drafts, its --steps (SGLang's --speculative-num-draft-"
                            "tokens 5, the root included): --draft-tokens 8 applies to a tree (--topk > 1)")
    with pytest.raises(LabError, match=r"^a chain verifies the 2 or 4 tokens it drafts, its --steps \(SGLang's "
                                       r"--speculative-num-draft-tokens steps \+ 1, the root included\): "
                                       r"--draft-tokens 4 applies"):
        grid([2, 4], [1], [4])


def test_a_sweep_checks_every_setting_before_the_first_decodes(tmp_path):
    """`check` refuses the second setting before the first one decodes (or is journaled); a setting the
    journal holds is done, not checked again."""
    settings = [{"steps": s} for s in (2, 4, 6)]
    decoded, checked = [], []

    def decode(s):
        decoded.append(s["steps"])
        return {"got": s["steps"]}

    def check(s):
        checked.append(s["steps"])
        if s["steps"] == 4:
            raise LabError("steps 4 is out of bounds")

    path = tmp_path / "sweep.json.partial"
    with Journal(path, {"seed": 0}) as journal, pytest.raises(LabError, match="^steps 4 is out of bounds$"):
        run_sweep(settings, decode, journal, check)
    assert decoded == [] and checked == [2, 4]
    assert Journal(path, {"seed": 0}).records == []

    with Journal(path, {"seed": 0}) as journal:
        run_sweep(settings[:1], decode, journal)
    checked.clear()
    with Journal(path, {"seed": 0}) as journal:
        assert run_sweep(settings, decode, journal, checked.append) == [{"got": 2}, {"got": 4}, {"got": 6}]
    assert checked == [{"steps": 4}, {"steps": 6}] and decoded == [2, 4, 6]


@pytest.fixture
def no_decode(monkeypatch):
    def decoded(*a, **k):
        raise AssertionError("decoded before every setting of the sweep was checked")

    monkeypatch.setattr(spec_engine.SpecEngine, "generate", decoded)


@pytest.mark.parametrize("steps", ["4,5000", "5000,4"])
def test_eval_refuses_a_sweeps_setting_past_the_targets_positions_before_decoding(
        random_llama, drafter_dir, prompts_file, prompts, cli_error, no_decode, tmp_path, steps):
    """--steps 4,5000 decoded steps 4 (warm-up and all prompts), then refused 5000 as past the target's
    1024 positions: refused first, in one line that names the flags and the value."""
    longest = max(map(len, prompts))
    err = cli_error(["eval", "--drafter", str(drafter_dir), "--target", str(random_llama), "--prompts",
                     str(prompts_file), "--steps", steps, "--max-new-tokens", "8", "--json", str(tmp_path / "s.json")])
    assert err == (f"error: --steps 5000 with --max-new-tokens 8 takes the longest prompt ({longest} tokens) to "
                   f"position {longest + 8 + 5000 - 2}, past the target's max_position_embeddings 1024")
    assert not (tmp_path / "s.json").exists() and not (tmp_path / "s.json.partial").exists()


def _deployed(tmp_path, deployment: dict):
    f = tmp_path / "verify.json"
    f.write_text(json.dumps({"deployment": deployment}))
    return f, apply_inputs(PRESETS[SEEDS], f)[0]


@pytest.mark.parametrize("value", [0.0, -0.0, 2.0, 2.5, True, False, -1, "2"])
def test_a_deployments_allreduce_count_must_be_an_integer(tmp_path, value):
    """allreduces_per_layer is a count: 0.0 passed as 0 (0.0 == 0) and the model carried the float on."""
    f = tmp_path / "verify.json"
    f.write_text(json.dumps({"deployment": {"allreduces_per_layer": value}}))
    with pytest.raises(LabError) as e:
        apply_inputs(PRESETS[SEEDS], f)
    assert str(e.value) == (f"{f}: deployment.allreduces_per_layer must be a positive integer or 0 (one device), "
                            f"got {value!r}")


@pytest.mark.parametrize("value", [0, 1, 2])
def test_a_deployments_integer_allreduce_count_is_taken(tmp_path, value):
    _, cfg = _deployed(tmp_path, {"allreduces_per_layer": value})
    assert cfg.allreduces_per_layer == value and type(cfg.allreduces_per_layer) is int


def test_an_overhead_of_zero_stays_a_number(tmp_path):
    """The overheads are milliseconds: 0.0 (`bench verify` writes it) and 0 are both no host work."""
    _, cfg = _deployed(tmp_path, {"cycle_overhead_ms": 0.0, "decode_overhead_ms": 0})
    assert (cfg.cycle_overhead_ms, cfg.decode_overhead_ms) == (0.0, 0)
    f, _ = _deployed(tmp_path, {"num_layers": 1})
    f.write_text(json.dumps({"deployment": {"num_layers": 0.0}}))
    with pytest.raises(LabError, match=r"deployment\.num_layers must be a positive integer, got 0\.0$"):
        apply_inputs(PRESETS[SEEDS], f)


def test_a_lone_draft_step_replaces_the_tables_an_earlier_input_set(tmp_path):
    """A lone draft_step_us (an n-gram eval's lookup) prices every draft step: the per-batch tables an earlier
    --inputs file set would otherwise win at their batches. Beside its own table, the other one stays."""
    cfg = dataclasses.replace(PRESETS[SEEDS], draft_step_us_by_batch={1: 500.0}, draft_extend_us_by_batch={1: 50.0})
    f = tmp_path / "ngram.json"
    f.write_text(json.dumps({"draft_step_us": 7}))
    got = apply_inputs(cfg, f)[0]
    assert (got.draft_step_us, got.draft_step_us_by_batch, got.draft_extend_us_by_batch) == (7.0, {}, {})
    f.write_text(json.dumps({"draft_step_us": 7, "draft_step_us_by_batch": {"1": 9}}))
    got = apply_inputs(cfg, f)[0]
    assert (got.draft_step_us, got.draft_step_us_by_batch, got.draft_extend_us_by_batch) == (7.0, {1: 9.0}, {1: 50.0})


def test_a_histogram_gives_the_accept_length_at_each_depth_to_its_longest_length(tmp_path):
    """Lengths 1 and 3 (0 and 2 drafts accepted): depth 1 emits 1 and 2, depth 2 emits 1 and 3; no deeper,
    as no step accepted more. A served length of 0 is refused: every verify step emits its bonus token."""
    assert accept_by_steps({"1": 1, "3": 1}, tmp_path) == [1.5, 2.0]
    assert accept_by_steps({"1": 4.0}, tmp_path) == [1.0]
    with pytest.raises(LabError, match="holds a served accept length of 0: each verify step emits at least 1"):
        accept_by_steps({"0": 1, "2": 1}, tmp_path)
