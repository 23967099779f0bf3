"""The target's logits as its own model makes them, from the head alone and from the whole model: a biased
lm_head (Phi, GPT-J, CodeGen, CTRL, and PhiMoE, Zaya, ERNIE 4.5 MoE where configured so) adds its bias,
which the map left out; Inkling cuts its logits to `unpadded_vocab_size`, where the map kept the padded
rows' (which took part in the sampled validation's log-partition), and Inkling 2 loads its head without
the padded rows its files hold, where the head read from them had them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.data.shards import Sequence
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import LogitMap, load_target, load_target_head
from drafter_lab.train.data import Examples, collate
from drafter_lab.train.ttt import TTTObjective

transformers = pytest.importorskip("transformers")

IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, vocab_size=96)
LAYERS = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
GPT = dict(n_embd=32, n_layer=2, n_head=4, n_positions=64)
BIASED = [
    ("phi", dict(**LAYERS, intermediate_size=64)),
    ("gptj", dict(**GPT, rotary_dim=4)),
    ("codegen", dict(**GPT, rotary_dim=4, n_ctx=64)),
    ("ctrl", dict(**GPT, dff=64)),  # its head is tied to the embedding; its bias is not
    ("phimoe", dict(**LAYERS, intermediate_size=64, num_key_value_heads=2, num_local_experts=2, lm_head_bias=True)),
    ("zaya", dict(**LAYERS, lm_head_bias=True)),
    ("ernie4_5_moe", dict(**LAYERS, intermediate_size=64, num_key_value_heads=2, moe_num_experts=2, moe_k=2,
                          moe_intermediate_size=16, use_bias=True)),
]
INKLING = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               head_dim=8, swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=8, sliding_window_size=8,
               intermediate_size=64, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
               n_shared_experts=1, d_rel=4, rel_extent=16, max_position_embeddings=64, tie_word_embeddings=False,
               unpadded_vocab_size=80)


def _saved(config, out, bias: bool = True):
    """The model of `config`, saved to `out`, with a head bias of random values (transformers makes it zero)."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    if bias:
        with torch.no_grad():
            model.get_output_embeddings().bias.normal_()
    model.save_pretrained(out)
    return model


def _own_logits(model, vocab: int = 96):
    with torch.no_grad():
        out = model(torch.randint(3, vocab, (1, 12)), output_hidden_states=True, use_cache=False)
    return out.hidden_states[-1][0], out.logits[0]


def _both(path):
    return load_target_head(path), load_target(path, tokenizer=False)


@pytest.mark.parametrize("model_type, fields", BIASED, ids=[f[0] for f in BIASED])
def test_a_biased_head_adds_its_bias(tmp_path, model_type, fields):
    if model_type not in transformers.CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {model_type}")
    model = _saved(transformers.AutoConfig.for_model(model_type, **IDS, **fields), tmp_path)
    final, logits = _own_logits(model)
    rows = torch.tensor([5, 17, 40, 95])  # a draft vocabulary's rows of the head
    for target in _both(tmp_path):
        torch.testing.assert_close(target.lm_head_bias(), model.get_output_embeddings().bias)
        head = target.lm_head_weight()
        torch.testing.assert_close(target.logit_map(final @ head.T), logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(target.logit_map(final @ head[rows].T, rows), logits[:, rows], rtol=1e-5, atol=1e-5)


def test_an_unbiased_head_has_no_bias(tmp_path):
    model = _saved(transformers.AutoConfig.for_model("phimoe", **IDS, **BIASED[4][1] | dict(lm_head_bias=False)),
                   tmp_path, bias=False)
    final, logits = _own_logits(model)
    for target in _both(tmp_path):
        assert target.lm_head_bias() is None and target.logit_map == LogitMap()
        torch.testing.assert_close(target.logit_map(final @ target.lm_head_weight().T), logits, rtol=1e-5, atol=1e-5)


def test_a_missing_or_misshapen_head_bias_or_embedding_is_refused(tmp_path):
    _saved(transformers.AutoConfig.for_model("phi", **IDS, **BIASED[0][1]), tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({**weights, "lm_head.bias": weights["lm_head.bias"][:90]}, tmp_path / "model.safetensors")
    with pytest.raises(LabError, match=r"lm_head.bias \(90,\) does not match the lm_head's 96 rows"):
        load_target_head(tmp_path)
    del weights["lm_head.bias"]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(LabError, match="no lm_head.bias tensor in the safetensors files"):
        load_target_head(tmp_path)
    del weights["model.embed_tokens.weight"]  # named too, not a KeyError from reading it
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(LabError, match="no model.embed_tokens.weight tensor in the safetensors files"):
        load_target_head(tmp_path)


def test_a_head_bias_is_taken_from_a_checkpoint_of_torch_weights_alone(tmp_path):
    model = _saved(transformers.AutoConfig.for_model("phi", **IDS, **BIASED[0][1]), tmp_path)
    (tmp_path / "model.safetensors").unlink()  # as older tools saved it: the head is then taken off the model
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    final, logits = _own_logits(model)
    head = load_target_head(tmp_path)
    torch.testing.assert_close(head.logit_map(final @ head.lm_head_weight().T), logits, rtol=1e-5, atol=1e-5)


def test_a_head_bias_is_read_where_no_model_class_builds(tmp_path, monkeypatch, random_llama):
    """Without the model class (a model of its own code, not trusted) a bias stored as Llama's would be is read,
    and a head stored without one has none."""
    import drafter_lab.targets.hf as hf

    model = _saved(transformers.AutoConfig.for_model("phi", **IDS, **BIASED[0][1]), tmp_path)
    monkeypatch.setattr(hf, "model_class", lambda whole: None)  # builds nothing: `None.from_config` raises
    torch.testing.assert_close(load_target_head(tmp_path).lm_head_bias(), model.lm_head.bias)
    assert load_target_head(random_llama).lm_head_bias() is None


@pytest.mark.parametrize("name", ["InklingTextConfig", "Inkling2TextConfig"])
def test_inkling_logits_stop_at_its_unpadded_vocab_size(tmp_path, name):
    if not hasattr(transformers, name):
        pytest.skip(f"this transformers has no {name}")
    model = _saved(getattr(transformers, name)(**INKLING), tmp_path, bias=False)
    final, logits = _own_logits(model, 80)
    assert logits.shape == (12, 80)
    head, whole = _both(tmp_path)
    # Inkling keeps the padded rows in its head and cuts its logits; Inkling 2 drops them from the head on load
    assert head.vocab_size == whole.vocab_size == len(model.get_output_embeddings().weight)
    for target in (head, whole):
        assert target.logit_map.vocab == 80
        w = target.lm_head_weight()
        rows = torch.tensor([3, 79, 80, 95])
        rows = rows[rows < len(w)]  # Inkling 2's head has no padded rows to draft
        torch.testing.assert_close(target.logit_map(final @ w.T), logits, rtol=1e-5, atol=1e-5)
        part = target.logit_map(final @ w[rows].T, rows)
        torch.testing.assert_close(part[:, :2], logits[:, rows[:2]], rtol=1e-5, atol=1e-5)
        assert (part[:, 2:] == -torch.inf).all()  # a padded row drafted: the target never samples it


@pytest.mark.parametrize("value, vocab", [(80, 80), (None, None), (True, None), (80.0, None), ("80", None)])
def test_only_an_integer_unpadded_vocab_size_cuts(value, vocab):
    assert LogitMap.of(SimpleNamespace(unpadded_vocab_size=value)).vocab == vocab


def _drafter(H: int, V: int, used: torch.Tensor) -> Eagle3Drafter:
    cfg = DrafterConfig(hidden_size=H, target_hidden_size=H, intermediate_size=64, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, draft_vocab_size=len(used), target_vocab_size=V,
                        aux_layer_ids=[1, 2, 3])
    torch.manual_seed(3)
    drafter = Eagle3Drafter(cfg)
    drafter.d2t.copy_(used - torch.arange(len(used)))
    drafter.t2d.zero_()
    drafter.t2d[used] = True
    return drafter


def test_the_teacher_over_the_draft_vocabulary_takes_the_bias_of_its_rows():
    """A bias is a head with one more column, over states with one more 1: the objective with the biased map
    equals the objective over that head, at a draft vocabulary of half the target's."""
    H, V, T = 32, 96, 10
    g = torch.Generator().manual_seed(1)
    w, bias = torch.randn(V, H, generator=g), 3 * torch.randn(V, generator=g)
    seq = Sequence(seq_id="s", input_ids=torch.randint(0, V, (T,), generator=g), loss_mask=torch.ones(T, dtype=torch.bool),
                   aux_hidden=torch.randn(T, 3 * H, generator=g), final_hidden=torch.randn(T, H, generator=g))
    ones = Sequence(**{**vars(seq), "final_hidden": torch.cat([seq.final_hidden, torch.ones(T, 1)], 1)})
    folded_head = torch.cat([w, bias[:, None]], 1)
    mapped = Examples([seq], w, 64, temperature=0.7, logit_map=LogitMap(bias=bias)).take([0])[0]
    folded = Examples([ones], folded_head, 64, temperature=0.7).take([0])[0]
    torch.testing.assert_close(mapped.logz, folded.logz)
    assert torch.equal(mapped.top1, folded.top1)
    used = torch.arange(0, V, 2)
    drafter = _drafter(H, V, used)
    loss_mapped, counts_mapped = TTTObjective(drafter, w[used], 3, 0.8, 0.7, logit_map=LogitMap(bias=bias))(
        collate([mapped]))
    loss_folded, counts_folded = TTTObjective(drafter, folded_head[used], 3, 0.8, 0.7)(collate([folded]))
    torch.testing.assert_close(loss_mapped, loss_folded)
    torch.testing.assert_close(counts_mapped, counts_folded)
