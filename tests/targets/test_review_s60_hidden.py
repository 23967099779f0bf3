"""run_capturing keeps only the hidden states asked for, each bit for bit what `output_hidden_states=True`
gives, on every decoder layout the lab loads; capture, the spec engine and the probe go through it."""

from __future__ import annotations

import warnings
import weakref

import pytest
import torch

from drafter_lab.data.capture import capture_states
from drafter_lab.data.shards import Sequence
from drafter_lab.errors import LabError
from drafter_lab.experiments.probe import _source_features
from drafter_lab.spec.target import TargetRunner
from drafter_lab.targets.hf import load_target, pad_token_id
from drafter_lab.targets.hidden import decoder_layout, run_capturing

V = 128
TEXT = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=5, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, pad_token_id=0,
            bos_token_id=1, eos_token_id=2)


def _text(name):
    import transformers as T

    moe = dict(num_experts_per_tok=2)
    return {
        "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**TEXT)),
        "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**TEXT)),
        "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(**TEXT, head_dim=8)),
        "qwen3_moe": lambda: T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(**TEXT, head_dim=8, num_experts=4,
                                                                   moe_intermediate_size=16, **moe)),
        "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(**TEXT, head_dim=8)),
        "gemma3_text": lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(**TEXT, head_dim=8)),  # scaled embeddings
        "olmo": lambda: T.OlmoForCausalLM(T.OlmoConfig(**TEXT)),
        "olmo2": lambda: T.Olmo2ForCausalLM(T.Olmo2Config(**TEXT)),
        "gpt_oss": lambda: T.GptOssForCausalLM(T.GptOssConfig(**{**TEXT, "intermediate_size": 32}, head_dim=8,
                                                              num_local_experts=4, layer_types=None, **moe)),
        "deepseek_v3": lambda: T.DeepseekV3ForCausalLM(T.DeepseekV3Config(
            **{**TEXT, "num_key_value_heads": 4}, moe_intermediate_size=16, n_routed_experts=4, n_group=1,
            topk_group=1, first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=8, **moe)),
        "llama4_text": lambda: T.Llama4ForCausalLM(T.Llama4TextConfig(**TEXT, head_dim=8, intermediate_size_mlp=64,
                                                                      num_local_experts=2)),
        "gpt_neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**TEXT)),
        # no `layers` (its blocks are `h`): the whole tuple, then the asked states
        "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(vocab_size=V, n_embd=32, n_layer=5, n_head=4)),
    }[name]()


def _multimodal(name):
    """The text-and-image wrappers tests/spec/test_multimodal_target.py loads, and Gemma 3's."""
    import transformers as T

    text = {k: v for k, v in TEXT.items() if k not in ("pad_token_id", "bos_token_id")}
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                  patch_size=16)
    config = {
        "qwen2_vl": lambda: T.Qwen2VLConfig(
            text_config=dict(text, rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}),
            vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2), image_token_id=V - 1,
            video_token_id=V - 2, vision_start_token_id=V - 3, eos_token_id=2),
        "mistral3": lambda: T.Mistral3Config(
            text_config=dict(text, model_type="mistral", head_dim=8, sliding_window=None),
            vision_config=dict(vision, model_type="pixtral", head_dim=16, image_size=64), image_token_index=V - 1),
        "llava": lambda: T.LlavaConfig(text_config=dict(text, model_type="llama"),
                                       vision_config=dict(vision, model_type="clip_vision_model"),
                                       image_token_index=V - 1),
        "gemma3": lambda: T.Gemma3Config(text_config=dict(text, head_dim=8), vision_config=vision,
                                         mm_tokens_per_image=4, image_token_index=V - 1),
    }[name]()
    return T.AutoModelForImageTextToText.from_config(config)


TEXT_ARCHS = ["llama", "qwen2", "qwen3", "qwen3_moe", "mistral", "gemma3_text", "olmo", "olmo2", "gpt_oss",
              "deepseek_v3", "llama4_text", "gpt_neox", "gpt2"]
MULTIMODAL = ["qwen2_vl", "mistral3", "llava", "gemma3"]


def _build(name):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _multimodal(name) if name in MULTIMODAL else _text(name)
    return model.eval()


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, V - 4, (2, 9), generator=g)
    attn = torch.ones_like(ids)
    attn[1, 6:] = 0  # right-padded, as capture batches are
    return dict(input_ids=ids, attention_mask=attn)


@pytest.mark.parametrize("name", TEXT_ARCHS + MULTIMODAL)
def test_every_kept_state_is_the_one_output_hidden_states_gives(name):
    model = _build(name)
    assert (decoder_layout(model) is None) == (name == "gpt2")
    with torch.no_grad():
        want = model(**_batch(), output_hidden_states=True)
        L = len(want.hidden_states) - 1
        for asked in ([0, *range(1, L)], [2, L // 2, L - 3], [L], [-2]):
            out, hs = run_capturing(model, asked, **_batch())
            assert sorted(hs) == sorted({i % (L + 1) for i in asked} | {L})
            for i in hs:
                assert torch.equal(hs[i], want.hidden_states[i]), (name, i)
            assert torch.equal(hs[-1], want.hidden_states[-1])
            assert torch.equal(out.logits, want.logits) and out.hidden_states is None
        _, hs = run_capturing(model, [1], final=False, **_batch())
        assert list(hs) == [1]
        with pytest.raises(KeyError, match="not kept"):
            hs[-1]
        with pytest.raises(LabError, match=f"hidden state index {L + 1} out of range"):
            run_capturing(model, [L + 1], **_batch())


def _hooks(model):
    return {name: (dict(m._forward_hooks), dict(m._forward_pre_hooks)) for name, m in model.named_modules()}


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_hooks_are_removed_when_the_forward_raises(name):
    model = _build(name)
    dec, layers = decoder_layout(model)
    before = _hooks(model)

    def boom(*_):
        raise RuntimeError("layer 3 fails")

    # after layer 0's input and layer 1's output were taken, before the final state is
    failing = layers[3].register_forward_pre_hook(boom)
    with pytest.raises(RuntimeError, match="layer 3 fails"), torch.no_grad():
        run_capturing(model, [0, 2, 4], **_batch())
    failing.remove()
    assert _hooks(model) == before
    with torch.no_grad():  # and the next run takes its own states only
        want = model(**_batch(), output_hidden_states=True).hidden_states
        _, hs = run_capturing(model, [0, 2, 4], **_batch())
    assert all(torch.equal(hs[i], want[i]) for i in (0, 2, 4, 5))


def test_a_layer_run_twice_is_an_error_not_a_guess():
    model = _build("llama")
    dec, layers = decoder_layout(model)
    layers[2] = layers[1]  # a shared layer: hooks on it fire twice per forward
    with pytest.raises(LabError, match="hidden state 2 was seen 2 times"), torch.no_grad():
        run_capturing(model, [2], use_cache=False, **_batch())


def _live_layer_outputs(model):
    """[the count of decoder layer outputs still alive when the model's forward returns]: what a
    forward holds of the L+1 hidden states at its end, the batch's peak of them."""
    _, layers = decoder_layout(model)
    refs, seen = [], []
    for layer in layers:
        layer.register_forward_hook(lambda m, a, out: refs.append(weakref.ref(out[0] if isinstance(out, tuple)
                                                                              else out)))
    model.register_forward_hook(lambda m, a, out: seen.append(sum(r() is not None for r in refs)))
    return seen


def test_capture_holds_the_aux_states_alone_not_all_of_them(random_llama):
    target = load_target(random_llama)  # 8 layers: aux ids [2, 4, 5], the outputs of layers 1, 3 and 4
    seen = _live_layer_outputs(target.model)
    items = [(f"s{i}", torch.randint(3, 200, (n,)), torch.ones(n, dtype=torch.bool)) for i, n in enumerate((12, 9))]
    got = {}
    capture_states(target, items, [2, 4, 5], torch.float32, 2, lambda *a, **k: None, got.__setitem__)
    # output_hidden_states=True holds 7 of the 8 (the last one's place is the norm's output)
    assert seen == [3]
    with torch.no_grad():
        pad = torch.full((3,), pad_token_id(target))
        want = target.model(torch.stack([items[0][1], torch.cat([items[1][1], pad])]),
                            attention_mask=torch.tensor([[1] * 12, [1] * 9 + [0] * 3]),
                            output_hidden_states=True).hidden_states
    for r, (_, ids, _) in enumerate(items):
        n = len(ids)
        assert torch.equal(got[r].aux_hidden, torch.cat([want[i][r, :n] for i in (2, 4, 5)], -1))
        assert torch.equal(got[r].final_hidden, want[-1][r, :n])


def test_the_spec_engine_and_the_probe_hold_the_aux_states_alone(random_llama):
    target = load_target(random_llama)
    ids = torch.randint(3, 200, (2, 10))
    with torch.no_grad():
        want = target.model(ids, output_hidden_states=True).hidden_states
    seen = _live_layer_outputs(target.model)
    _, aux = TargetRunner(target.model, [2, 4, 5]).prefill(ids, torch.tensor([10, 10]))
    assert torch.equal(aux, torch.cat([want[i] for i in (2, 4, 5)], -1))
    seq = Sequence("s", ids[0], torch.ones(10, dtype=torch.bool), torch.zeros(10, 192), torch.zeros(10, 64))
    (probed,) = _source_features(target, [seq], [2, 4, 5])
    assert torch.equal(probed.aux_hidden, torch.cat([want[i][0] for i in (2, 4, 5)], -1))
    assert torch.equal(probed.final_hidden, want[-1][0])
    assert seen == [3, 3]  # output_hidden_states=True: [7, 7]
