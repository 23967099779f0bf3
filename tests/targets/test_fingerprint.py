"""fingerprint: a model directory's name from config.json, its safetensors headers and a sample of every
tensor; legacy_fingerprint: the older name, from each weight file's leading and trailing MiB."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from drafter_lab.errors import LabError
from drafter_lab.targets import fingerprint as fp
from drafter_lab.targets.fingerprint import fingerprint, legacy_fingerprint, recorded_name

MiB = 1 << 20


def _blob(size, salt):
    return (bytes([salt]) + bytes(range(251)) * (size // 251 + 1))[:size]


def _tensors(seed=0):
    """A layered checkpoint in miniature: 4 MiB of embedding and head around layers of 2 MiB and 1 KiB."""
    g = torch.Generator().manual_seed(seed)
    out = {"lm_head.weight": torch.randn(512, 1024, generator=g), "model.embed_tokens.weight": torch.randn(512, 1024, generator=g)}
    for i in range(4):
        out[f"model.layers.{i}.self_attn.q_proj.weight"] = torch.randn(512, 1024, generator=g)
        out[f"model.layers.{i}.input_layernorm.weight"] = torch.randn(256, generator=g)
    return out


def _model(path, tensors=None, **config):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    save_file(tensors if tensors is not None else _tensors(), path / "model.safetensors")
    return path


def test_recorded_fingerprints_keep_their_value(tmp_path):
    # Feature sets, paired drafters and journals name their target by it: a formula change orphans them.
    # The file is written byte by byte, so that no library's version moves the value.
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    sizes = {"a": 300, "b": 5 * MiB // 4, "c": 40 * MiB // 4}
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, n in sizes.items():
        header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [offset, offset + 4 * n]}
        offset += 4 * n
    raw = json.dumps(header).encode()
    data = b"".join(((torch.arange(n) % (97 + k)).float() / 7).numpy().tobytes() for k, n in enumerate(sizes.values()))
    (model / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    assert fingerprint(model) == "47ea61acccb6f011"
    blobs = tmp_path / "blobs"  # the legacy formula reads bytes, not tensors: its value from before it was renamed
    blobs.mkdir()
    (blobs / "config.json").write_text('{"model_type": "llama"}')
    for i, size in enumerate([3 * MiB, 1000]):
        (blobs / f"model-{i + 1:05d}-of-00002.safetensors").write_bytes(_blob(size, 7 + 2 * i))
    assert legacy_fingerprint(blobs) == "3b343d2a9f11fd78"


@pytest.mark.parametrize("name", ["model.layers.1.self_attn.q_proj.weight", "model.layers.2.input_layernorm.weight",
                                  "lm_head.weight", "model.embed_tokens.weight"])
def test_a_fine_tuned_tensor_changes_it_wherever_it_lies(tmp_path, name):
    base = _tensors()
    tuned = {**base, name: base[name] + 0.05}  # a fine-tune, or a merged LoRA, rewrites the whole tensor
    a, b = _model(tmp_path / "base", base), _model(tmp_path / "tuned", tuned)
    assert fingerprint(a) != fingerprint(b)
    if "layers" in name:  # the middle of the file: the legacy name could not tell them apart
        assert legacy_fingerprint(a) == legacy_fingerprint(b)


def test_every_part_of_a_large_tensor_is_sampled(tmp_path, monkeypatch):
    """A tensor is sampled once per TENSOR_STRIDE bytes, so a fine-tune of any part that large (one expert
    of a fused tensor of experts, say) changes the name. Here 16 windows over 1 MiB, not over 256 MiB."""
    monkeypatch.setattr(fp, "TENSOR_STRIDE", 64 << 10)
    before = fingerprint(_model(tmp_path / "a", {"experts": torch.zeros(MiB // 4)}))
    for part in (0, 7, 15):
        t = torch.zeros(MiB // 4)
        t[part * MiB // 64:(part + 1) * MiB // 64] = 1.0
        assert fingerprint(_model(tmp_path / f"b{part}", {"experts": t})) != before


@pytest.mark.parametrize("rows", [slice(0, 2), slice(-2, None)])
def test_rows_trained_at_either_end_of_a_matrix_change_it(tmp_path, rows):
    """Tokens added to a vocabulary, their embedding rows trained alone: the first or the last rows."""
    base = {"model.embed_tokens.weight": torch.zeros(4096, 64)}  # 1 MiB: sampled, not hashed whole
    tuned = torch.zeros(4096, 64)
    tuned[rows] = 1.0
    assert fingerprint(_model(tmp_path / "a", base)) != fingerprint(_model(tmp_path / "b", {
        "model.embed_tokens.weight": tuned}))


def test_what_is_not_a_weight_file_is_left_out_and_a_dangling_one_is_one_line(tmp_path):
    model = _model(tmp_path / "m")
    before = fingerprint(model)
    (model / "training_args.bin").write_bytes(b"the Trainer's arguments")  # no weights
    (model / "shards.bin").mkdir()
    assert fingerprint(model) == before
    (model / "model-00002-of-00002.safetensors").symlink_to(tmp_path / "never-downloaded")
    with pytest.raises(LabError, match="cannot read the weights") as e:
        fingerprint(model)
    assert "model-00002-of-00002.safetensors" in str(e.value)


def test_header_config_and_file_names_are_part_of_it(tmp_path):
    base = _tensors()
    names = {fingerprint(_model(tmp_path / "m", base))}
    names.add(fingerprint(_model(tmp_path / "dtype", {**base, "lm_head.weight": base["lm_head.weight"].half()})))
    names.add(fingerprint(_model(tmp_path / "shape", {**base, "lm_head.weight": base["lm_head.weight"].T.contiguous()})))
    names.add(fingerprint(_model(tmp_path / "cfg", base, rope_theta=1e6)))
    renamed = _model(tmp_path / "file", base)
    (renamed / "model.safetensors").rename(renamed / "model-00001-of-00001.safetensors")
    names.add(fingerprint(renamed))
    assert len(names) == 5


def test_a_pickled_checkpoint_is_sampled_over_the_file(tmp_path):
    base = _tensors()
    names = []
    for k, tensors in enumerate([base, {**base, "model.layers.2.self_attn.q_proj.weight": base[
            "model.layers.2.self_attn.q_proj.weight"] + 0.05}]):
        path = tmp_path / f"m{k}"
        path.mkdir()
        (path / "config.json").write_text("{}")
        torch.save(tensors, path / "pytorch_model.bin")
        names.append(fingerprint(path))
    assert names[0] != names[1]


def test_a_name_recorded_the_older_way_is_kept_beside_the_work_that_holds_it(tmp_path):
    model = _model(tmp_path / "m")
    assert recorded_name(model, legacy_fingerprint(model)) == legacy_fingerprint(model) != fingerprint(model)
    assert recorded_name(model, None) == recorded_name(model, "0123456789abcdef") == fingerprint(model)


@pytest.mark.parametrize("data, problem", [(b"\x05", "bad header length"),
                                           ((10 ** 9).to_bytes(8, "little"), "bad header length"),
                                           (len(b"{nope").to_bytes(8, "little") + b"{nope", "unreadable header"),
                                           (len(h := b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 99]}}')
                                            .to_bytes(8, "little") + h + bytes(16), "tensor w lies outside the file"),
                                           (len(h := b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8, 16]}}')
                                            .to_bytes(8, "little") + h + bytes(16), "unreadable header"),
                                           (len(h := b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, "8"]}}')
                                            .to_bytes(8, "little") + h + bytes(16), "unreadable header")])
def test_a_broken_safetensors_file_is_one_line_naming_it(tmp_path, data, problem):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(data)
    with pytest.raises(LabError, match=problem) as e:
        fingerprint(model)
    assert str(model / "model.safetensors") in str(e.value)


def test_a_directory_without_config_is_one_line(tmp_path):
    with pytest.raises(LabError, match="config.json is missing"):
        fingerprint(tmp_path)
