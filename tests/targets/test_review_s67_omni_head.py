"""A multimodal wrapper that keeps its lm_head in its language model and answers None for its own
(Nemotron-H Omni): the head-only load looked for Llama's names and refused, the whole load failed on
None.weight."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from drafter_lab.targets.hf import load_target, load_target_head

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    from transformers import AutoConfig, AutoModelForImageTextToText

    try:
        AutoConfig.for_model("nemotron_h_omni")
    except ValueError:
        pytest.skip(f"transformers {transformers.__version__} has no nemotron_h_omni")
    text = dict(vocab_size=512, hidden_size=64, layers_block_type=["mamba", "attention", "mlp"], num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, intermediate_size=128, ssm_state_size=16, mamba_num_heads=4,
                mamba_head_dim=16, n_groups=1, chunk_size=16, model_type="nemotron_h")
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, patch_size=16, image_size=32,
                  max_img_size=64, intermediate_size=64, video_temporal_patch_size=2)
    cfg = AutoConfig.for_model("nemotron_h_omni", text_config=text, vision_config=vision, projector_hidden_size=64,
                               vision_hidden_size=32)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("omni")
    AutoModelForImageTextToText.from_config(cfg).save_pretrained(out)
    with safe_open(out / "model.safetensors", "pt") as f:
        names = [n for n in f.keys() if n.startswith("language_model.")]
        stored = {k: f.get_tensor(n) for k, n in (("embed", "language_model.backbone.embeddings.weight"),
                                                   ("head", "language_model.lm_head.weight")) if n in names}
    assert len(stored) == 2, names  # the stored names this test is about
    assert not torch.equal(stored["embed"], stored["head"])  # untied: each must come from its own tensor
    return out, stored


def test_the_head_only_load_finds_the_language_models_head(omni):
    path, stored = omni
    t = load_target_head(path)
    assert torch.equal(t.embed_weight(), stored["embed"])
    assert torch.equal(t.lm_head_weight(), stored["head"])


def test_the_whole_load_gives_the_language_models_head(omni):
    path, stored = omni
    t = load_target(path, tokenizer=False)
    assert torch.equal(t.lm_head_weight(), stored["head"])
    assert torch.equal(t.embed_weight(), stored["embed"])
