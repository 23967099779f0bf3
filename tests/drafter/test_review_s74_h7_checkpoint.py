"""Review s74 h7: mutation audit of checkpoint.py's readers and writers (read_vocab, build_drafter's shape
check, load_drafter beside a target, drafter_tensors, export's serving settings)."""

from __future__ import annotations

import json

import pytest
import torch

from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import export, load_drafter, read_vocab, save_drafter
from drafter_lab.errors import LabError

from .test_model import random_drafter, small_config


def test_read_vocab_takes_a_directory_given_as_text(saved):
    """The CLI passes its argument as a str: a drafter directory read as a vocab file was 'not a file'."""
    path, state = saved
    vocab = read_vocab(str(path))
    assert torch.equal(vocab.d2t, state["d2t"]) and torch.equal(vocab.t2d, state["t2d"])


def test_an_embedding_of_another_width_passed_to_load_drafter_is_one_line(saved):
    """The file's tensors were checked when read; one passed in is checked where the drafter is built."""
    path, _ = saved
    with pytest.raises(LabError) as e:
        load_drafter(path, embed_weight=torch.zeros(101, 47))
    assert str(e.value) == (f"{path / 'model.safetensors'}: tensor 'embed_tokens.weight' has shape (101, 47), the "
                            "drafter needs (101, 48)")


def _speculators_serving(out) -> tuple[int, dict]:
    sc = json.loads((out / "config.json").read_text())["speculators_config"]
    return sc["proposal_methods"][0]["speculative_tokens"], sc["verifier"]


def _record(path, run) -> None:
    (path / "run.json").write_text(json.dumps(run))


@pytest.mark.parametrize("depth", [1, 7])
def test_a_speculators_export_tells_vllm_the_recorded_ttt_depth(saved, tmp_path, depth):
    path, _ = saved
    _record(path, {"config": {"ttt_steps": depth}, "target": {}})
    export(path, formats.SPECULATORS, tmp_path / "o")
    assert _speculators_serving(tmp_path / "o") == (depth, {"name_or_path": None, "architectures": []})
    export(path, formats.SPECULATORS, tmp_path / "flag", speculative_tokens=2)  # the flag wins
    assert _speculators_serving(tmp_path / "flag")[0] == 2


@pytest.mark.parametrize("depth", [0, "5", True])
def test_a_recorded_ttt_depth_that_is_no_positive_integer_is_one_line(saved, tmp_path, depth):
    path, _ = saved
    _record(path, {"config": {"ttt_steps": depth}, "target": {}})
    with pytest.raises(LabError) as e:
        export(path, formats.SPECULATORS, tmp_path / "o")
    assert str(e.value) == f"{path / 'run.json'}: 'ttt_steps' is {depth!r}, not a positive integer"
    assert not (tmp_path / "o").exists()


def test_a_verifier_given_as_a_local_directory_is_written_as_its_absolute_path(saved, tmp_path, monkeypatch):
    """vLLM, started from another directory, finds a relative verifier nowhere; a hub name stays as given."""
    path, _ = saved
    (tmp_path / "targets/tuned").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    export(path, formats.SPECULATORS, tmp_path / "local", verifier="targets/tuned")
    assert _speculators_serving(tmp_path / "local")[1]["name_or_path"] == str(tmp_path / "targets/tuned")
    export(path, formats.SPECULATORS, tmp_path / "hub", verifier="org/tuned")
    assert _speculators_serving(tmp_path / "hub")[1]["name_or_path"] == "org/tuned"


def test_a_given_verifier_takes_the_recorded_architecture(saved, tmp_path):
    path, _ = saved
    _record(path, {"config": {}, "target": {"architecture": "Qwen3ForCausalLM"}})
    export(path, formats.SPECULATORS, tmp_path / "v", verifier="org/t")
    assert _speculators_serving(tmp_path / "v")[1] == {"name_or_path": "org/t", "architectures": ["Qwen3ForCausalLM"]}
    export(path, formats.SPECULATORS, tmp_path / "none")  # no verifier named: no architecture for it either
    assert _speculators_serving(tmp_path / "none")[1] == {"name_or_path": None, "architectures": []}


def test_a_blank_recorded_architecture_is_one_line_naming_the_run_record(saved, tmp_path):
    path, _ = saved
    _record(path, {"config": {}, "target": {"architecture": " "}})
    with pytest.raises(LabError) as e:
        export(path, formats.SPECULATORS, tmp_path / "o", verifier="org/t")
    assert str(e.value) == f"{path / 'run.json'}: run record's target.architecture is ' ', not a class name"


def test_a_speculators_source_reexported_keeps_its_serving_settings(tmp_path):
    src = save_drafter(random_drafter(small_config(), seed=2, dtype=torch.float32), tmp_path / "src",
                       formats.SPECULATORS, speculative_tokens=3, verifier="org/t", verifier_architectures=("A",))
    export(src, formats.SPECULATORS, tmp_path / "again")
    assert _speculators_serving(tmp_path / "again") == (3, {"name_or_path": "org/t", "architectures": ["A"]})


def test_load_drafter_puts_every_tensor_on_the_device_asked(saved):
    """"meta" stands for an accelerator here: the tensors are built on the CPU, then moved."""
    path, _ = saved
    drafter = load_drafter(path, device="meta")
    assert {t.device.type for t in drafter.state_dict().values()} == {"meta"}


def test_save_and_export_take_directories_given_as_text(tmp_path):
    drafter = random_drafter(small_config(), seed=4, dtype=torch.float32)
    src = save_drafter(drafter, str(tmp_path / "src"))
    assert src == tmp_path / "src" and (src / "model.safetensors").is_file()
    out = export(str(src), formats.SPECULATORS, str(tmp_path / "out"))
    assert out == tmp_path / "out" and (out / "config.json").is_file()


def test_an_unknown_format_is_refused_before_the_source_is_read(tmp_path):
    with pytest.raises(LabError) as e:
        export(tmp_path / "missing", "eagle", tmp_path / "o")
    assert str(e.value) == f"unknown drafter format 'eagle'; known: {', '.join(formats.FORMATS)}"


def test_a_speculators_export_of_one_draft_token_is_written(saved, tmp_path):
    """1, the least vLLM serves, is at the edge of the check that refuses 0."""
    path, _ = saved
    export(path, formats.SPECULATORS, tmp_path / "o", speculative_tokens=1)
    assert _speculators_serving(tmp_path / "o")[0] == 1
