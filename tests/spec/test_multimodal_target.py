"""Text-and-image targets transformers gives no causal-LM class (Qwen2-VL, Mistral 3, LLaVA) load whole
through their image-text-to-text class and serve text alone: captured features are their text model's
hidden states, and speculative decoding on them is lossless."""

from __future__ import annotations

import json

import pytest
import torch

from drafter_lab.data.capture import prepare_features
from drafter_lab.data.shards import FeatureSet
from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.targets.hf import load_target, load_target_head, load_tokenizer

from .conftest import make_drafter
from .test_engine import hf_greedy

TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=1024, tie_word_embeddings=False)


def _config(family: str, vocab: int, eos: int):
    from transformers import LlavaConfig, Mistral3Config, Qwen2VLConfig

    text = dict(TEXT, vocab_size=vocab, eos_token_id=eos)
    if family == "qwen2_vl":  # M-RoPE: text positions fill all three sections alike
        return Qwen2VLConfig(text_config=dict(text, rope_scaling={"type": "mrope", "mrope_section": [2, 2, 4]}),
                             vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2),
                             image_token_id=vocab - 1, video_token_id=vocab - 2, vision_start_token_id=vocab - 3,
                             eos_token_id=eos)
    if family == "mistral3":
        return Mistral3Config(text_config=dict(text, model_type="mistral", head_dim=16, sliding_window=None),
                              vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64,
                                                 num_hidden_layers=1, num_attention_heads=2, head_dim=16,
                                                 image_size=64, patch_size=16), image_token_index=vocab - 1)
    return LlavaConfig(text_config=dict(text, model_type="llama"),
                       vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=16),
                       image_token_index=vocab - 1)


ARCHS = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "mistral3": "Mistral3ForConditionalGeneration",
         "llava": "LlavaForConditionalGeneration"}


@pytest.fixture(scope="module", params=list(ARCHS))
def multimodal(request, random_llama, tmp_path_factory):
    """A random text-and-image model of `family` with the random Llama's tokenizer, saved as its family is."""
    from transformers import AutoModelForImageTextToText

    tok = load_tokenizer(random_llama)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(_config(request.param, len(tok), tok.eos_token_id))
    out = tmp_path_factory.mktemp(request.param) / "model"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return request.param, out


def test_it_loads_whole_as_its_wrapper_with_its_text_models_shape(multimodal):
    family, path = multimodal
    target = load_target(path)
    assert (target.architecture, type(target.model).__name__) == (ARCHS[family], ARCHS[family])
    assert (target.num_layers, target.hidden_size, target.vocab_size) == (4, 64, len(target.tokenizer))
    head = load_target_head(path)  # the head-only loader agrees on the matrices
    assert torch.equal(head.embed_weight(), target.embed_weight())
    assert torch.equal(head.lm_head_weight(), target.lm_head_weight())


def test_speculative_decoding_on_it_is_lossless(multimodal, prompts):
    _, path = multimodal
    target = load_target(path)
    engine = SpecEngine(target, make_drafter(target, seed=2), SpecConfig(max_new_tokens=12, stop_at_eos=False, steps=3,
                                                                        topk=1))
    base = engine.generate(prompts[:3], speculative=False)
    assert engine.generate(prompts[:3]).tokens == base.tokens
    assert base.tokens[0] == hf_greedy(target, prompts[0], 12)  # the wrapper's own generate


def test_its_features_are_its_text_models_hidden_states(multimodal, tmp_path):
    _, path = multimodal
    convs = tmp_path / "chats.jsonl"
    convs.write_text("".join(json.dumps({"id": f"c{i}", "conversations": [
        {"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer number {i}"}]}) + "\n"
        for i in range(3)))
    manifest = prepare_features(path, convs, tmp_path / "feat", max_length=64, val_fraction=0.0)
    assert manifest.aux_layer_ids == [2, 2, 1]  # [2, L//2, L-3] of its 4 text layers
    target = load_target(path)
    for seq in FeatureSet(tmp_path / "feat").sequences("train"):
        with torch.no_grad():
            states = target.model(input_ids=seq.input_ids[None], output_hidden_states=True).hidden_states
        want = torch.cat([states[i][0] for i in manifest.aux_layer_ids], dim=-1)
        torch.testing.assert_close(seq.aux_hidden.float(), want, rtol=1e-4, atol=1e-4)
