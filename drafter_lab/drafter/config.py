"""Shape of an EAGLE-3 drafter (what config.json's LlamaForCausalLMEagle3 fields carry)."""

from __future__ import annotations

from dataclasses import dataclass, field

SGLANG = "sglang"
SPECULATORS = "speculators"
FORMATS = (SGLANG, SPECULATORS)
"""Checkpoint layouts read and written (drafter.formats)."""


SAMPLE_TOPK = 1
"""A sampled chain's proposal q: the drafter's top-k renormalised at the temperature (the engine
drafts from it, and a validation's sampled acceptance assumes it). 1, as SGLang and vLLM serve EAGLE
at any temperature: the draft is the drafter's top-1, accepted with probability p(x) (q one-hot)."""


@dataclass
class DrafterConfig:
    """One-layer EAGLE-3 drafter; any hidden size, head layout, RoPE theta, eps and draft vocab."""

    hidden_size: int
    """Drafter hidden size H (width of the midlayer residual stream and of embed_tokens)."""
    intermediate_size: int
    """SwiGLU MLP width."""
    num_attention_heads: int
    """Query heads."""
    num_key_value_heads: int
    """Key/value heads (< num_attention_heads for GQA)."""
    head_dim: int
    """Per-head width; q/k/v project 2H -> heads * head_dim."""
    draft_vocab_size: int
    """N: rows of lm_head, entries of d2t."""
    target_vocab_size: int
    """V: the target's vocabulary (rows of embed_tokens, entries of t2d)."""
    target_hidden_size: int
    """H_t: fc takes 3 * H_t (the three aux hidden states)."""
    aux_layer_ids: list[int] = field(default_factory=list)
    """Target HF hidden_states indices the fc input comes from (convention hf_hidden_states)."""
    rope_theta: float = 10000.0
    """RoPE base."""
    rope_scaling: dict | None = None
    """RoPE frequency scaling, as config.json's `rope_scaling` names it: None (plain RoPE), {"rope_type":
    "linear", "factor"}, or {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"}. SpecForge, SGLang and vLLM apply it; the lab's own drafters
    keep plain RoPE (for_target does not copy the target's)."""
    rms_norm_eps: float = 1e-6
    """RMSNorm epsilon, for all four norms."""
    max_position_embeddings: int = 4096
    """Longest position the drafter is configured for (recorded for SGLang)."""
    norm_before_residual: bool = False
    """The residual stream starts from hidden_norm(h), not h: speculators' variant (its default for
    the drafters it trains), which vLLM serves and SGLang has no switch for."""

    @property
    def own_embedding(self) -> bool:
        """H != H_t: the target's embedding has the wrong width, so the drafter trains its own."""
        return self.hidden_size != self.target_hidden_size

    def attention_problem(self) -> str | None:
        """What makes this attention shape unbuildable (GQA groups, RoPE's halves), else None."""
        if self.num_attention_heads % self.num_key_value_heads:
            return (f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                    f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:  # RoPE rotates the two halves of each head
            return f"head_dim {self.head_dim} is odd: RoPE needs an even one"
        return None

    @classmethod
    def for_target(cls, target_config, draft_vocab_size: int, aux_layer_ids, **overrides) -> DrafterConfig:
        """Mirror the target's attention layout, as SpecForge's and SGLang's drafters do."""
        hidden = int(target_config.hidden_size)
        heads = int(target_config.num_attention_heads)
        base = dict(
            hidden_size=hidden,
            intermediate_size=int(_given(target_config, "intermediate_size", 4 * hidden)),
            num_attention_heads=heads,
            num_key_value_heads=int(getattr(target_config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(target_config, "head_dim", None) or hidden // heads),
            draft_vocab_size=int(draft_vocab_size),
            target_vocab_size=int(target_config.vocab_size),
            target_hidden_size=hidden,
            aux_layer_ids=[int(i) for i in aux_layer_ids],
            rope_theta=target_rope_theta(target_config),
            rms_norm_eps=float(_given(target_config, "rms_norm_eps", 1e-6)),
            max_position_embeddings=int(_given(target_config, "max_position_embeddings", 4096)),
        )
        base.update(overrides)
        return cls(**base)


def _given(target_config, name: str, default):
    """A target config field, or `default` where it is absent or null (a config.json may write null for
    a size the model does not bound)."""
    value = getattr(target_config, name, None)
    return default if value is None else value


def target_rope_theta(target_config) -> float:
    """The target's RoPE base: transformers 4's rope_theta, or 5's rope_parameters. Where its layer types
    differ (Gemma 3, OLMo 3) they are nested by type: the full-attention layers' base (transformers 4's
    rope_theta), as the drafter's one layer attends over the whole context too."""
    if theta := getattr(target_config, "rope_theta", None):
        return float(theta)
    params = getattr(target_config, "rope_parameters", None) or getattr(target_config, "rope_scaling", None) or {}
    if not isinstance(params, dict):
        return 10000.0
    nested = [p for p in params.values() if isinstance(p, dict) and "rope_theta" in p]
    if "rope_theta" not in params and nested:
        full = params.get("full_attention")
        params = full if isinstance(full, dict) and "rope_theta" in full else nested[0]
    return float(params.get("rope_theta", 10000.0))

