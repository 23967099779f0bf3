"""Interop sweep (review s69 h6): the drafter layouts SGLang, vLLM, SpecForge, speculators and EAGLE's releases
publish, each built small from one drafter's real safetensors, read back to the source's numbers (loaded tensors
and a forward pass), exported and transferred as the plain file is. A shard index that places a tensor in a shard
without it is refused (it read as a drafter that leaves the tensor out); a config without draft_vocab_size beside
a smaller head, and an EAGLE-2 release, are refused naming what they are."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import export, load_drafter, read_checkpoint, read_vocab, save_drafter
from drafter_lab.drafter.transfer import init_from
from drafter_lab.errors import LabError

from .test_model import random_drafter, small_config
from .test_transfer import USED_NEW, fresh, source, target_head, vocab

VOCAB = ("d2t", "t2d")


def _write(path, state: dict, config: dict, shards: list[list[str]] | None = None, bin_files: bool = False):
    """A drafter directory holding `state` under its own names: one file, or `shards` (lists of names) with the
    shard index save_pretrained writes beside them; pytorch_model*.bin files with `bin_files`."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    stem, ext = ("pytorch_model", "bin") if bin_files else ("model", "safetensors")

    def save(tensors, name):
        torch.save(tensors, path / name) if bin_files else save_file(tensors, str(path / name))

    if shards is None:
        save(state, f"{stem}.{ext}")
        return path
    weight_map = {}
    for i, names in enumerate(shards, 1):
        name = f"{stem}-{i:05d}-of-{len(shards):05d}.{ext}"
        save({k: state[k] for k in names}, name)
        weight_map.update(dict.fromkeys(names, name))
    (path / f"{stem}.{ext}.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def _renamed(state: dict, rename) -> dict:
    return {rename(k): v for k, v in state.items()}


def _cast(state: dict, dtype) -> dict:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


def _halves(state: dict) -> list[list[str]]:
    """Three shards, as save_pretrained cuts by size: the midlayer across the last two, d2t in the first and t2d
    in the last."""
    names = sorted(state)
    return [names[:4], names[4:9], names[9:]]


# name -> (what the files hold, made from the lab's SGLang state; shards or None; .bin files)
VARIANTS = {
    "sharded with an index": (lambda s: s, _halves, False),
    "sharded .bin with an index": (lambda s: s, _halves, True),
    "d2t as int32, t2d left out": (lambda s: {**{k: v for k, v in s.items() if k != "t2d"},
                                              "d2t": s["d2t"].to(torch.int32)}, None, False),
    "t2d as uint8": (lambda s: {**s, "t2d": s["t2d"].to(torch.uint8)}, None, False),
    "no embedding (SpecForge)": (lambda s: {k: v for k, v in s.items() if k != formats.EMBED}, None, False),
    "bf16": (lambda s: _cast(s, torch.bfloat16), None, False),
    "fp16": (lambda s: _cast(s, torch.float16), None, False),
    "bf16 linears, fp32 norms": (lambda s: {k: v.bfloat16() if v.dim() == 2 else v for k, v in s.items()}, None,
                                 False),
    "'model.' prefix, head and vocab bare": (
        lambda s: _renamed(s, lambda k: k if k in (formats.HEAD, *VOCAB) else "model." + k), None, False),
    "'layers.0.' under an SGLang config": (lambda s: _renamed(s, lambda k: k.replace("midlayer.", "layers.0.")),
                                           None, False),
    "'model.layers.0.' sharded": (lambda s: _renamed(s, lambda k: "model." + k.replace("midlayer.", "layers.0.")),
                                  lambda s: [sorted(s)[:6], sorted(s)[6:]], False),
    "extras engines skip": (lambda s: {**s, "verifier_lm_head.weight": torch.full((37, 48), float("nan")),
                                       "verifier_norm.weight": torch.ones(48), "fc.bias": torch.zeros(48),
                                       "midlayer.self_attn.rotary_emb.inv_freq": torch.rand(8)}, None, False),
}


def _variant(tmp_path, saved, kind):
    path, state = saved
    make, shards, bin_files = VARIANTS[kind]
    held = make(dict(state))
    return _write(tmp_path / "v", held, json.loads((path / "config.json").read_text()),
                  shards(held) if shards else None, bin_files), held


def _forward(drafter):
    """Draft logits of a TTT step and the target ids they map to, on fixed random inputs."""
    cfg = drafter.config
    g = torch.Generator().manual_seed(0)
    embeds, aux = torch.randn(2, 6, cfg.hidden_size, generator=g), torch.randn(2, 6, 3 * cfg.target_hidden_size,
                                                                               generator=g)
    with torch.no_grad():
        h = drafter.ttt_step(embeds, drafter.project(aux), torch.arange(6).expand(2, 6), [])
        logits = drafter.logits(h)
    return logits, drafter.to_target_ids(logits.argmax(-1))


@pytest.mark.parametrize("kind", VARIANTS)
def test_each_published_layout_loads_the_numbers_its_files_hold(tmp_path, saved, kind):
    path, state = saved
    variant, held = _variant(tmp_path, saved, kind)
    embed = state[formats.EMBED]
    drafter = load_drafter(variant, embed_weight=embed)
    got, files = drafter.state_dict(), {formats.canonical_name(k): v for k, v in held.items()}
    for name, t in state.items():
        if name in VOCAB:  # the lab's own dtypes, whatever the file's
            assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
        else:  # each float exactly as the file holds it, in the fp32 asked for (the embedding: the one given)
            assert torch.equal(got[name], (embed if name == formats.EMBED else files[name]).float()), name
    if all(v.dtype == torch.float32 for v in held.values() if v.is_floating_point()):
        for a, b in zip(_forward(drafter), _forward(load_drafter(path, embed_weight=embed)), strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("fmt", [formats.SGLANG, formats.SPECULATORS])
@pytest.mark.parametrize("kind", ["'model.layers.0.' sharded", "d2t as int32, t2d left out", "bf16 linears, fp32 norms",
                                  "no embedding (SpecForge)"])
def test_an_export_of_each_layout_writes_the_files_numbers_under_the_layouts_names(tmp_path, saved, kind, fmt):
    """Every tensor bit for bit in its own dtype, d2t as int64 and t2d as bool (what engines and DESIGN expect),
    nothing the source left out added but t2d (SGLang and vLLM never read it)."""
    path, state = saved
    variant, held = _variant(tmp_path, saved, kind)
    out = export(variant, fmt, tmp_path / "out")
    written = load_file(str(out / "model.safetensors"))
    src = read_checkpoint(variant).tensors
    assert set(written) == {formats.export_name(n, fmt) for n in src}
    for name, t in src.items():
        assert written[formats.export_name(name, fmt)].dtype == t.dtype and torch.equal(
            written[formats.export_name(name, fmt)], t), name
    assert written["d2t"].dtype == torch.int64 and written["t2d"].dtype == torch.bool
    assert torch.equal(written["d2t"], state["d2t"]) and torch.equal(written["t2d"], state["t2d"])
    if fmt == formats.SPECULATORS:  # speculators' own greedy proposal, as its trainer writes it
        assert json.loads((out / "config.json").read_text())["speculators_config"]["proposal_methods"] == [
            {"proposal_type": "greedy", "speculative_tokens": 5, "accept_tolerance": 0.0, "verifier_accept_k": 1}]


@pytest.mark.parametrize("kind", ["'model.layers.0.' sharded", "d2t as int32, t2d left out", "bf16",
                                  "extras engines skip", "no embedding (SpecForge)"])
def test_a_transfer_from_each_layout_matches_one_from_the_plain_file(tmp_path, kind):
    src, plain = source(tmp_path, formats.SGLANG)
    state = load_file(str(plain / "model.safetensors"))
    make, shards, _ = VARIANTS[kind]
    held = make(state)
    variant = _write(tmp_path / "v", held, json.loads((plain / "config.json").read_text()),
                     shards(held) if shards else None)
    a, b = fresh(src.config), fresh(src.config)
    report_a = init_from(a, plain, target_head(), vocab(USED_NEW))
    report_b = init_from(b, variant, target_head(), vocab(USED_NEW))
    lossy = kind == "bf16"
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        if name in ("embed_tokens.weight", *VOCAB) or not lossy:
            assert torch.equal(x, y), name
        else:
            assert torch.equal(x.bfloat16(), y.bfloat16()), name
    assert (report_a.rows_copied, report_a.rows_from_target) == (report_b.rows_copied, report_b.rows_from_target)


def _whole_vocab(tmp_path):
    """A whole-vocabulary drafter (draft vocab = target vocab, d2t a permutation) in two shards and their index,
    head and vocab in the second: a file that may leave out both (the target's head; d2t the identity)."""
    cfg = small_config(draft_vocab_size=101)
    src = random_drafter(cfg, seed=8, dtype=torch.float32)
    with torch.no_grad():
        src.d2t.copy_(torch.arange(101).roll(5) - torch.arange(101))
    whole = save_drafter(src, tmp_path / "src")
    state = load_file(str(whole / "model.safetensors"))
    late = [formats.HEAD, "norm.weight", *VOCAB]
    path = _write(tmp_path / "whole", state, json.loads((whole / "config.json").read_text()),
                  [[k for k in state if k not in late], late])
    return path, state


def test_a_whole_vocab_drafter_in_shards_reads_its_own_head_and_mapping(tmp_path):
    path, state = _whole_vocab(tmp_path)
    ckpt = read_checkpoint(path)
    assert ckpt.has_head and ckpt.filled == ()
    assert torch.equal(ckpt.tensors["d2t"], state["d2t"]) and torch.equal(ckpt.tensors[formats.HEAD], state[formats.HEAD])


@pytest.mark.parametrize("reader", [read_checkpoint, read_vocab])
def test_a_shard_index_placing_a_tensor_in_a_shard_without_it_is_refused(tmp_path, reader):
    """The second shard swapped for one of another save (a download mixed across revisions) holding only norm:
    the head and d2t the index puts there read as left out, and a whole-vocabulary drafter loaded with its
    target's head and the identity mapping in place of its own, without a word."""
    path, state = _whole_vocab(tmp_path)
    save_file({"norm.weight": state["norm.weight"]}, str(path / "model-00002-of-00002.safetensors"))
    with pytest.raises(LabError) as e:
        reader(path)
    assert str(e.value) == (f"{path}: model.safetensors.index.json puts tensor 'd2t' in "
                            "model-00002-of-00002.safetensors, which does not hold it: a shard of another save, or a "
                            "partial download")


@pytest.mark.parametrize("fmt", [formats.SGLANG, formats.SPECULATORS])
def test_a_config_without_draft_vocab_size_reads_as_the_whole_vocab_and_a_smaller_head_says_so(tmp_path, saved,
                                                                                                fmt):
    """As vLLM reads it: the field absent is the target's vocab size. A 37-row head beside it is refused naming
    the field the config lacks (the message said "draft_vocab_size is 101", a number config.json never held)."""
    path, state = saved
    src = export(path, fmt, tmp_path / "src") if fmt == formats.SPECULATORS else path
    config = json.loads((src / "config.json").read_text())
    del config["draft_vocab_size"]
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(LabError) as e:
        read_checkpoint(src)
    assert str(e.value) == (f"{src / 'model.safetensors'}: tensor 'lm_head.weight' has 37 rows, the config's "
                            "draft_vocab_size is 101 (config.json gives none, which reads as its vocab_size: set "
                            "draft_vocab_size 37 there)")
    config["draft_vocab_size"] = 37
    (src / "config.json").write_text(json.dumps(config))
    assert read_checkpoint(src).config.draft_vocab_size == 37


def test_an_eagle_1_or_2_release_is_named_as_such(tmp_path):
    """EAGLE's own EAGLE-2 releases: config `LlamaForCausalLM` of one layer (as its EAGLE-3 ones), fc over
    cat(embedding, hidden) with a bias, `layers.0.*` without input_layernorm or hidden_norm. It was refused as
    "lacks tensor 'midlayer.input_layernorm.weight'", a drafter with a tensor lost."""
    h, inter, kv = 48, 80, 32
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h, "intermediate_size": inter,
              "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 101,
              "bias": True, "rms_norm_eps": 1e-5}
    shapes = {"fc.weight": (h, 2 * h), "fc.bias": (h,), "embed_tokens.weight": (101, h),
              "layers.0.self_attn.q_proj.weight": (h, h), "layers.0.self_attn.k_proj.weight": (kv, h),
              "layers.0.self_attn.v_proj.weight": (kv, h), "layers.0.self_attn.o_proj.weight": (h, h),
              "layers.0.post_attention_layernorm.weight": (h,), "layers.0.mlp.gate_proj.weight": (inter, h),
              "layers.0.mlp.up_proj.weight": (inter, h), "layers.0.mlp.down_proj.weight": (h, inter)}
    path = _write(tmp_path / "eagle2", {k: torch.randn(s) for k, s in shapes.items()}, config)
    with pytest.raises(LabError) as e:
        load_drafter(path)
    assert str(e.value) == (f"{path / 'model.safetensors'}: an EAGLE-1/2 drafter (its fc is (48, 96), over the "
                            "embedding and one hidden state, and it has no hidden_norm), not an EAGLE-3 one")


def test_an_eagle_3_release_as_eagle_publishes_it_loads_its_numbers(tmp_path):
    """EAGLE's own EAGLE-3 releases: `LlamaForCausalLM` of one layer, no head_dim (hidden / heads, an integer),
    a pytorch_model.bin without the embedding, RoPE's inv_freq buffer beside the midlayer."""
    src = random_drafter(small_config(head_dim=12), seed=9, dtype=torch.float32)
    saved = save_drafter(src, tmp_path / "lab")
    config = {k: v for k, v in json.loads((saved / "config.json").read_text()).items() if k != "head_dim"}
    state = {k: v for k, v in load_file(str(saved / "model.safetensors")).items() if k != formats.EMBED}
    state["midlayer.self_attn.rotary_emb.inv_freq"] = torch.rand(6)
    path = _write(tmp_path / "release", state, {**config, "architectures": ["LlamaForCausalLM"]}, bin_files=True)
    drafter = load_drafter(path, embed_weight=src.embed_tokens.weight.detach())
    assert drafter.config.head_dim == 12 and isinstance(drafter.config.head_dim, int)
    for a, b in zip(_forward(drafter), _forward(src), strict=True):
        assert torch.equal(a, b)


def test_a_shard_index_of_the_other_format_is_not_held_against_the_files_read(tmp_path, saved):
    """A release that ships both formats: the safetensors are read, and the .bin index beside them names what
    its own files hold (here a verifier head the safetensors leave out), which is no tensor lost."""
    path, state = saved
    torch.save({"verifier_lm_head.weight": torch.zeros(37, 48)}, path / "pytorch_model-00001-of-00001.bin")
    (path / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"weight_map": {"verifier_lm_head.weight": "pytorch_model-00001-of-00001.bin"}}))
    ckpt = read_checkpoint(path)
    assert "verifier_lm_head.weight" not in ckpt.tensors and ckpt.files == [path / "model.safetensors"]


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda sc: {**sc, "proposal_methods": "greedy"}, "config's 'proposal_methods' is 'greedy', not a list of JSON objects"),
    (lambda sc: {**sc, "proposal_methods": [5]}, "config's 'proposal_methods' is [5], not a list of JSON objects"),
    (lambda sc: {**sc, "verifier": {"architectures": "LlamaForCausalLM"}},
     "config's verifier 'architectures' is 'LlamaForCausalLM', not a list of class names"),
    (lambda sc: {**sc, "verifier": {"architectures": [None]}},
     "config's verifier 'architectures' is [None], not a list of class names"),
])
def test_a_speculators_sources_malformed_serving_fields_are_one_line_naming_its_config(tmp_path, saved, edit, problem):
    path, _ = saved
    src = export(path, formats.SPECULATORS, tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    config["speculators_config"] = edit(config["speculators_config"])
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(LabError) as e:
        export(src, formats.SPECULATORS, tmp_path / "out")
    assert str(e.value) == f"{src / 'config.json'}: {problem}"


def test_a_speculators_sources_null_draft_length_falls_back_as_an_absent_one(tmp_path, saved):
    path, _ = saved
    src = export(path, formats.SPECULATORS, tmp_path / "src", speculative_tokens=3)
    config = json.loads((src / "config.json").read_text())
    config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = None
    (src / "config.json").write_text(json.dumps(config))
    out = export(src, formats.SPECULATORS, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["speculators_config"]["proposal_methods"][0][
        "speculative_tokens"] == formats.SPECULATIVE_TOKENS


@pytest.mark.parametrize("key", ["hidden_size", "intermediate_size", "vocab_size"])
def test_a_config_without_a_size_it_has_no_default_for_is_one_line(tmp_path, saved, key):
    """Else None went on as the size (a TypeError from `hidden // heads`, or a drafter of None rows)."""
    path, _ = saved
    config = json.loads((path / "config.json").read_text())
    del config[key]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value) == f"{path / 'config.json'}: config lacks {key!r}"
