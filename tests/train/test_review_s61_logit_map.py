"""Targets that scale or cap their logits (Granite, Cohere, Falcon-H1, Gemma 2) train and validate
against the distribution they sample from: the teacher and the sampled validation took
softmax(final_hidden @ lm_head.T), 16x too sharp for a Granite of `logits_scaling` 16."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from drafter_lab.data.shards import Sequence
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.targets.hf import LogitMap, load_target_head
from drafter_lab.train.data import Examples, collate
from drafter_lab.train.ttt import TTTObjective

SMALL = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)


def _model(kind: str):
    from transformers import CohereConfig, FalconH1Config, Gemma2Config, GraniteConfig, LlamaConfig

    if kind == "granite":
        return GraniteConfig(**SMALL, logits_scaling=16.0)
    if kind == "cohere":
        return CohereConfig(**SMALL, logit_scale=0.0625)
    if kind == "gemma2":
        return Gemma2Config(**SMALL, head_dim=8, final_logit_softcapping=0.5)
    if kind == "falcon_h1":
        return FalconH1Config(**SMALL, lm_head_multiplier=3.0, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8,
                              mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=16)
    return LlamaConfig(**SMALL)


@pytest.mark.parametrize("kind, scale, cap", [("granite", 1 / 16, None), ("cohere", 0.0625, None),
                                              ("gemma2", 1.0, 0.5), ("falcon_h1", 3.0, None), ("llama", 1.0, None)])
def test_the_map_read_off_the_config_gives_the_models_logits(kind, scale, cap, tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_model(kind)).eval()
    model.save_pretrained(tmp_path)
    head = load_target_head(tmp_path)
    assert head.logit_map == LogitMap(scale, cap)
    ids = torch.randint(0, 96, (1, 12))
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    mine = head.logit_map(out.hidden_states[-1][0] @ head.lm_head_weight().T)
    torch.testing.assert_close(mine, out.logits[0], rtol=1e-5, atol=1e-5)
    if kind != "llama":  # the map changes something: the raw product is not the model's logits
        assert not torch.allclose(out.hidden_states[-1][0] @ head.lm_head_weight().T, out.logits[0], atol=1e-3)


def _sequence(H: int, V: int, T: int = 10) -> Sequence:
    g = torch.Generator().manual_seed(1)
    return Sequence(seq_id="s", input_ids=torch.randint(0, V, (T,), generator=g), loss_mask=torch.ones(T, dtype=torch.bool),
                    aux_hidden=torch.randn(T, 3 * H, generator=g), final_hidden=torch.randn(T, H, generator=g))


def test_the_teacher_and_the_sampled_validation_take_the_mapped_logits():
    """A scale is a head scaled by it: the objective with the map equals the objective over that head."""
    H, V, N = 32, 96, 96  # a draft vocab of the whole vocabulary: every position scores
    g = torch.Generator().manual_seed(2)
    lm_head = torch.randn(V, H, generator=g)
    granite = LogitMap(1 / 16)
    seq = _sequence(H, V)
    mapped = Examples([seq], lm_head, 64, temperature=0.7, logit_map=granite).take([0])[0]
    folded = Examples([seq], lm_head / 16, 64, temperature=0.7).take([0])[0]
    torch.testing.assert_close(mapped.logz, folded.logz)
    raw = Examples([seq], lm_head, 64, temperature=0.7).take([0])[0]
    assert not torch.allclose(raw.logz, mapped.logz)

    cfg = DrafterConfig(hidden_size=H, target_hidden_size=H, intermediate_size=64, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, draft_vocab_size=N, target_vocab_size=V,
                        aux_layer_ids=[1, 2, 3])
    torch.manual_seed(3)
    drafter = Eagle3Drafter(cfg)
    drafter.t2d.fill_(True)  # draft id i is target id i
    used = torch.arange(N) + drafter.d2t
    batch = collate([mapped])
    loss_mapped, _ = TTTObjective(drafter, lm_head[used], 3, 0.8, 0.7, logit_map=granite)(batch)
    loss_folded, _ = TTTObjective(drafter, lm_head[used] / 16, 3, 0.8, 0.7)(collate([folded]))
    loss_raw, _ = TTTObjective(drafter, lm_head[used], 3, 0.8, 0.7)(batch)
    torch.testing.assert_close(loss_mapped, loss_folded)
    assert not torch.allclose(loss_raw, loss_mapped)
