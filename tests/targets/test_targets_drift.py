"""linear_cka against a direct reference, its invariances, and measure_drift on real HF Llamas."""

from __future__ import annotations

import copy

import pytest
import torch

from drafter_lab.targets.drift import CkaMoments, linear_cka, measure_drift


def reference_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """HSIC form with an explicit centring matrix: tr(K H L H) / sqrt(tr(KHKH) tr(LHLH))."""
    x, y = x.double(), y.double()
    n = x.shape[0]
    h = torch.eye(n, dtype=torch.float64) - 1.0 / n
    k, l_ = h @ (x @ x.T) @ h, h @ (y @ y.T) @ h
    return float((k * l_).sum() / torch.sqrt((k * k).sum() * (l_ * l_).sum()))


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(torch.seed() % 2**31)  # fresh inputs every run


def random_orthogonal(d: int, gen) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    return q


def test_matches_reference_on_random_inputs(gen):
    x = torch.randn(300, 24, generator=gen) + 2.0  # offset: centring must matter
    y = x[:, :16] @ torch.randn(16, 40, generator=gen) + 0.5 * torch.randn(300, 40, generator=gen)
    assert linear_cka(x, y) == pytest.approx(reference_cka(x, y), rel=1e-9)
    assert 0.0 < linear_cka(x, y) < 1.0


def test_identical_inputs_give_one(gen):
    x = torch.randn(200, 32, generator=gen)
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)


def test_invariant_to_orthogonal_transform_and_isotropic_scale(gen):
    x = torch.randn(256, 20, generator=gen, dtype=torch.float64)
    y = torch.tanh(x @ torch.randn(20, 20, generator=gen, dtype=torch.float64))
    base = linear_cka(x, y)
    q = random_orthogonal(20, gen)
    assert linear_cka(x @ q, y) == pytest.approx(base, rel=1e-9)
    assert linear_cka(x, 7.3 * y) == pytest.approx(base, rel=1e-9)
    assert linear_cka(0.01 * (x @ q), y @ random_orthogonal(20, gen)) == pytest.approx(base, rel=1e-9)
    # ...but not to an anisotropic scaling: the invariances above are not vacuous.
    stretch = torch.ones(20, dtype=torch.float64)
    stretch[0] = 50.0
    assert linear_cka(x * stretch, y) != pytest.approx(base, rel=1e-3)


def test_unrelated_inputs_score_low(gen):
    x, y = torch.randn(4000, 8, generator=gen), torch.randn(4000, 8, generator=gen)
    assert linear_cka(x, y) < 0.05


def test_moments_accumulate_like_one_shot(gen):
    x, y = torch.randn(500, 12, generator=gen), torch.randn(500, 7, generator=gen)
    y[:, :3] += x[:, :3]
    m = CkaMoments()
    for xs, ys in zip(x.split(128), y.split(128)):
        m.update(xs, ys)
    assert m.value() == pytest.approx(linear_cka(x, y), rel=1e-10)


def test_no_variance_is_nan_and_mismatched_rows_raise(gen):
    x = torch.randn(50, 4, generator=gen)
    assert linear_cka(torch.ones(50, 4), x) != linear_cka(torch.ones(50, 4), x)  # nan
    with pytest.raises(ValueError):
        linear_cka(x, x[:40])


def _llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg).eval()


def test_measure_drift_same_model_is_zero(gen):
    model = _llama()
    batches = [torch.randint(0, 97, (3, 17), generator=gen) for _ in range(2)]
    out = measure_drift(model, copy.deepcopy(model), batches)
    assert len(out["cka"]) == 9  # hidden_states 0..L
    assert all(c == pytest.approx(1.0, abs=1e-9) for c in out["cka"])
    assert out["kl"] == pytest.approx(0.0, abs=1e-12)
    assert out["tokens"] == 2 * 3 * 17
    assert out["base_nll"] == pytest.approx(out["tuned_nll"])


def test_measure_drift_matches_direct_computation(gen):
    base = _llama()
    tuned = copy.deepcopy(base)
    with torch.no_grad():
        for p in tuned.model.layers[5].parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    ids = torch.randint(0, 97, (4, 21), generator=gen)
    out = measure_drift(base, tuned, [ids[:2], ids[2:]])
    with torch.no_grad():
        hb = base(input_ids=ids, output_hidden_states=True)
        ht = tuned(input_ids=ids, output_hidden_states=True)
    lp_b = torch.log_softmax(hb.logits.double(), -1)
    lp_t = torch.log_softmax(ht.logits.double(), -1)
    kl = (lp_b.exp() * (lp_b - lp_t)).sum(-1).mean().item()
    assert out["kl"] == pytest.approx(kl, rel=1e-6)
    assert out["kl"] > 0
    nll = -lp_t[:, :-1].gather(-1, ids[:, 1:, None]).mean().item()
    assert out["tuned_nll"] == pytest.approx(nll, rel=1e-6)
    for i in range(9):
        want = reference_cka(hb.hidden_states[i].flatten(0, 1), ht.hidden_states[i].flatten(0, 1))
        assert out["cka"][i] == pytest.approx(want, rel=1e-6)
    # Layers before the perturbed one (hidden_states 0..5) are untouched; later ones moved.
    assert all(c == pytest.approx(1.0, abs=1e-9) for c in out["cka"][:6])
    assert out["cka"][6] < 1.0 - 1e-6
