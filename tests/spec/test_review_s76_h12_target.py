"""TargetRunner parts the engine tests reach only indirectly: join / keep (continuous batching), the
attention switch, the cache-layer check and the logits kept by the model."""

from __future__ import annotations

import inspect

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.spec.target import TargetRunner
from drafter_lab.spec.tree import chain


def _tiny(cls_cfg, cls_model, **extra):
    cfg = cls_cfg(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, **extra)
    torch.manual_seed(0)
    return cls_model(cfg).eval()


def _verify(runner, tokens):
    """A chain verify of tokens [B, T] -> logits [B, T, V]."""
    tree = chain(tokens[:, 0], tokens[:, 1:])
    return runner.verify(tree.tokens, tree.depth, tree.ancestors(), aux=False)[0]


def _fresh(target, ids, lens):
    runner = TargetRunner(target.model, [], target.path)
    logits, _ = runner.prefill(ids, torch.tensor(lens), aux=False)
    return runner, logits


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_joined_and_kept_rows_verify_as_a_fresh_batch(target):
    """Rows prefilled apart and joined (caches padded with dead slots), then some dropped and
    reordered, verify as the same rows prefilled together."""
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(target.vocab_size, (3, 8), generator=gen)
    lens = [6, 3, 8]
    draft = torch.randint(target.vocab_size, (3, 3), generator=gen)

    runner, _ = _fresh(target, ids[:2, :6], lens[:2])
    logits, aux = runner.join(ids[2:], torch.tensor(lens[2:]), aux=False)
    assert aux is None
    _close(logits, _fresh(target, ids[2:], lens[2:])[1])
    assert runner.lens.tolist() == lens
    assert runner.cache.get_seq_length() == 8
    ref, _ = _fresh(target, ids, lens)
    _close(_verify(runner, draft), _verify(ref, draft))

    runner, _ = _fresh(target, ids[:2, :6], lens[:2])
    runner.join(ids[2:], torch.tensor(lens[2:]), aux=False)
    runner.keep(torch.tensor([2, 0]))
    assert runner.lens.tolist() == [8, 6]
    ref, _ = _fresh(target, ids[[2, 0]], [8, 6])
    _close(_verify(runner, draft[[2, 0]]), _verify(ref, draft[[2, 0]]))


def test_keep_cuts_the_cache_to_the_longest_kept_row_and_to_nothing_for_no_rows(target):
    gen = torch.Generator().manual_seed(6)
    runner, _ = _fresh(target, torch.randint(target.vocab_size, (3, 8), generator=gen), [8, 3, 5])
    runner.keep(torch.tensor([2, 1]))
    assert runner.lens.tolist() == [5, 3]
    assert {tuple(getattr(layer, n).shape[:3]) for layer in runner.cache.layers for n in ("keys", "values")} \
        == {(2, runner.cache.layers[0].keys.shape[1], 5)}
    runner.keep(torch.tensor([], dtype=torch.long))
    assert runner.lens.tolist() == []
    assert {getattr(layer, n).shape[2] for layer in runner.cache.layers for n in ("keys", "values")} == {0}


def test_join_without_append_makes_the_new_rows_the_batch(target):
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(target.vocab_size, (2, 7), generator=gen)
    runner, _ = _fresh(target, ids[:1, :4], [4])
    runner.join(ids, torch.tensor([7, 5]), aux=False, append=False)
    assert runner.lens.tolist() == [7, 5]
    draft = torch.randint(target.vocab_size, (2, 2), generator=gen)
    ref, _ = _fresh(target, ids, [7, 5])
    _close(_verify(runner, draft), _verify(ref, draft))


def test_the_model_computes_logits_only_at_the_kept_positions(target):
    """prefill asks the model for each row's last position alone (one list shared by the rows),
    not the logits of every prompt position."""
    shapes = []
    hook = target.model.register_forward_hook(lambda m, a, out: shapes.append(tuple(out.logits.shape)))
    try:
        gen = torch.Generator().manual_seed(8)
        _, logits = _fresh(target, torch.randint(target.vocab_size, (3, 9), generator=gen), [9, 4, 4])
    finally:
        hook.remove()
    assert shapes == [(3, 2, target.vocab_size)]
    assert logits.shape == (3, target.vocab_size)


def test_a_target_without_a_dense_mask_attention_is_switched_to_sdpa_and_eager_is_kept():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = _tiny(LlamaConfig, LlamaForCausalLM)
    model.set_attn_implementation("eager")
    TargetRunner(model, [])
    assert model.config._attn_implementation == "eager"
    model.set_attn_implementation("flex_attention")
    TargetRunner(model, [])
    assert model.config._attn_implementation == "sdpa"


def test_a_sliding_window_target_cache_is_refused_naming_the_target():
    from transformers import MistralConfig, MistralForCausalLM

    runner = TargetRunner(_tiny(MistralConfig, MistralForCausalLM, sliding_window=4), [], "/models/mistral")
    with pytest.raises(LabError, match="DynamicSlidingWindowLayer is not supported") as e:
        runner.prefill(torch.zeros(1, 3, dtype=torch.long), torch.tensor([3]), aux=False)
    assert "/models/mistral" in str(e.value)


def _only_kw(name):
    """A Llama whose forward takes its cache under `name` alone (older transformers: past_key_values)."""
    from transformers import LlamaForCausalLM

    class Model(LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, use_cache=None,
                    logits_to_keep=0, output_hidden_states=None, **kw):
            if set(kw) != {name}:
                raise TypeError(f"forward() got cache keywords {sorted(kw)}, takes {name}")
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                   use_cache=use_cache, logits_to_keep=logits_to_keep,
                                   output_hidden_states=output_hidden_states, **{parents: kw[name]})

    # the installed transformers' own keyword (it renamed past_key_values to cache)
    parents = "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"

    # the runner reads the cache keyword off the forward's signature
    params = [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None) for p in (
        "input_ids", "attention_mask", "position_ids", name, "use_cache", "logits_to_keep", "output_hidden_states")]
    Model.forward.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *params])
    return Model


@pytest.mark.parametrize("name", ["cache", "past_key_values"])
def test_the_cache_goes_in_under_the_name_the_models_forward_takes(name):
    """transformers renamed past_key_values to cache; the runner passes whichever the model takes,
    and the verify then sees the prefilled prompt."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = _tiny(LlamaConfig, _only_kw(name))
    plain = _tiny(LlamaConfig, LlamaForCausalLM)
    ids = torch.tensor([[3, 9, 4, 7, 1]])
    got, want = [], []
    for m, out in ((model, got), (plain, want)):
        runner = TargetRunner(m, [1])
        runner.prefill(ids[:, :3], torch.tensor([3]))
        out.append(_verify(runner, ids[:, 3:]))
    _close(got[0], want[0])
