"""Python face of the fused EAGLE-3 draft step, `torch.ops.drafter_lab.draft_step` (DESIGN section 4).

`draft_step(drafter, ...)` takes the same arguments and returns the same tuple as
`Eagle3Drafter.draft_step` (the reference and test oracle): by default it runs the compiled op when
the extension is built and the tensors are on CUDA, else the reference. Importing this module
registers the op and the fake kernel that torch.compile and opcheck trace with; the op's schema
lives in csrc/ops.cpp.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from drafter_lab.errors import LabError
from drafter_lab.kernels import _ext

if TYPE_CHECKING:
    from drafter_lab.drafter.config import DrafterConfig
    from drafter_lab.drafter.model import Eagle3Drafter

OP_NAME = "drafter_lab::draft_step"
CUDA_MAX_TOPK = 16
"""The largest topk the CUDA kernels take (kMaxTopk in csrc/draft_forward)."""
OP_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The dtypes the op computes in (csrc/draft_forward/args.h); it refuses any other."""


@functools.cache
def _load() -> str | None:
    """Registers the op (importing drafter_lab._C) and its fake kernel; returns why not, or None."""
    reason = _ext.unavailable_reason()  # importing _C runs its TORCH_LIBRARY registrations
    if not _has_kernel("CPU"):
        return reason or "drafter_lab._C has no draft_step op"
    torch.library.register_fake(OP_NAME)(_fake_draft_step)
    return None


def available(device: torch.device | str | None = None) -> bool:
    """True when the compiled op is registered, and when `device` is given, has a kernel for it."""
    if _load() is not None:
        return False
    if device is None:
        return True
    return _has_kernel("CUDA" if torch.device(device).type == "cuda" else "CPU")


def _has_kernel(dispatch_key: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(OP_NAME, dispatch_key)
    except RuntimeError:  # the op is not registered at all
        return False


def _fake_draft_step(embeds, hidden, positions, k_cache, v_cache, cache_lens, fc_weight, input_norm_weight,
                     hidden_norm_weight, q_weight, k_weight, v_weight, o_weight, post_norm_weight, gate_weight,
                     up_weight, down_weight, norm_weight, lm_head_weight, d2t, eps, rope_inv_freq, topk):
    torch._check(embeds.dim() == 2, lambda: "draft_step: embeds must be [B, H]")
    # The Meta dispatch key outranks CPU/CUDA: one meta argument among real ones lands here, and
    # without this check got uninitialised outputs on embeds' device instead of the kernels' error.
    tensors = (hidden, positions, k_cache, v_cache, cache_lens, fc_weight, input_norm_weight, hidden_norm_weight,
               q_weight, k_weight, v_weight, o_weight, post_norm_weight, gate_weight, up_weight, down_weight,
               norm_weight, lm_head_weight, d2t, rope_inv_freq)
    for t in tensors:
        if t is not None:
            torch._check(t.device == embeds.device,
                         lambda t=t: f"draft_step: all tensors must be on {embeds.device}; found one on {t.device}")
    batch, hidden_size = embeds.shape
    torch._check(topk >= 1 and topk <= lm_head_weight.shape[0], lambda: "draft_step: topk outside [1, N]")
    return (
        embeds.new_empty(batch, hidden_size),
        embeds.new_empty(batch, topk, dtype=torch.int64),
        embeds.new_empty(batch, topk, dtype=torch.float32),
    )


def op_takes(cfg: DrafterConfig) -> bool:
    """Whether the CUDA kernels implement this drafter at all: plain EAGLE-3 (not norm_before_residual),
    head_dim 64 or 128, H a multiple of 8 and the MLP width of 16."""
    return (not cfg.norm_before_residual and cfg.head_dim in (64, 128) and cfg.hidden_size % 8 == 0
            and cfg.intermediate_size % 16 == 0)


def cuda_supports(drafter: Eagle3Drafter, embeds: torch.Tensor, hidden: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, topk: int, weights: tuple | None = None) -> bool:
    """Whether the CUDA kernels take this step: `op_takes` the drafter; one dtype for activations,
    caches and weights, and one of OP_DTYPES (an fp64 drafter, the tests' oracle, is the reference's);
    contiguous, 16-byte aligned caches and weights (what the op would raise on, the reference takes: a
    view at an odd offset of a larger buffer); the hidden input width a multiple of 8; topk <= CUDA_MAX_TOPK.
    `weights`: the drafter's `_weights`, where the caller has them (the walk over its modules costs as
    much as the rest)."""
    c = drafter.config
    dtype = drafter.lm_head.weight.dtype
    weights = weights or _weights(drafter)
    return (op_takes(c) and dtype in OP_DTYPES and embeds.dtype == k_cache.dtype == v_cache.dtype == dtype
            and all(w.dtype == dtype for w in weights)
            and all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in (k_cache, v_cache, *weights))
            and (hidden.dtype == dtype or hidden.shape[-1] != c.hidden_size)
            and hidden.shape[-1] % 8 == 0 and 1 <= topk <= CUDA_MAX_TOPK)


def _weights(drafter: Eagle3Drafter) -> tuple[torch.Tensor, ...]:
    """The op's weight arguments, in its order (fc first), as the drafter holds them."""
    layer = drafter.midlayer
    attn, mlp = layer.self_attn, layer.mlp
    return (
        drafter.fc.weight, layer.input_layernorm.weight, layer.hidden_norm.weight, attn.q_proj.weight,
        attn.k_proj.weight, attn.v_proj.weight, attn.o_proj.weight, layer.post_attention_layernorm.weight,
        mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, drafter.norm.weight, drafter.lm_head.weight,
    )


def op_args(drafter: Eagle3Drafter, embeds, hidden, positions, k_cache, v_cache, cache_lens, topk,
            weights: tuple | None = None) -> tuple:
    """The op's positional arguments for one step of `drafter` (fc applied as the reference decides);
    `weights` as in `cuda_supports`."""
    cfg = drafter.config
    fc, *weights = (w.detach() for w in weights or _weights(drafter))
    if hidden.shape[-1] == 3 * cfg.target_hidden_size and hidden.shape[-1] != cfg.hidden_size:
        hidden = hidden.to(fc.dtype)
    elif hidden.shape[-1] == cfg.hidden_size:
        fc = None  # a later step: the hidden state is already the drafter's width
    else:
        raise ValueError(f"hidden has width {hidden.shape[-1]}, want {cfg.hidden_size} or 3*H_t")
    return (embeds, hidden, positions, k_cache, v_cache, cache_lens, fc, *weights, drafter.d2t,
            float(cfg.rms_norm_eps), rope_frequencies(drafter, embeds.device), int(topk))


def rope_frequencies(drafter: Eagle3Drafter, device) -> torch.Tensor:
    """The drafter's RoPE frequencies (model.rope_inv_freq, fp32) on `device`, made once per drafter,
    device and RoPE setting: a draft step launches nothing to remake them, and a CUDA graph replays
    the same memory."""
    from drafter_lab.drafter.model import rope_inv_freq

    cfg = drafter.config
    key = (str(device), cfg.head_dim, cfg.rope_theta, repr(cfg.rope_scaling))
    made = drafter.__dict__.setdefault("_rope_frequencies", {})
    if key not in made:
        made[key] = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, device, torch.float32)
    return made[key]


def draft_step(
    drafter: Eagle3Drafter,
    embeds: torch.Tensor,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    topk: int,
    *,
    use_fused: bool | None = None,
):
    """One draft token per row against a KV cache; same contract as `Eagle3Drafter.draft_step`.

    use_fused: None runs the compiled op when it is built for CUDA, the tensors are on CUDA and
    `cuda_supports` the step, else the reference; True forces the op (the CPU op included; LabError when it is not built);
    False forces the reference.
    """
    weights = None  # walked once per step, for the check and the op's arguments
    if use_fused is None:
        use_fused = embeds.is_cuda and available(embeds.device)
        if use_fused:
            weights = _weights(drafter)
            use_fused = cuda_supports(drafter, embeds, hidden, k_cache, v_cache, topk, weights)
    if not use_fused:
        return drafter.draft_step(embeds, hidden, positions, k_cache, v_cache, cache_lens, topk)
    why = _load()
    if why is not None:
        raise LabError(f"the fused draft_step op is unavailable: {why}")
    if not available(embeds.device):
        raise LabError(f"the fused draft_step op was built without a {embeds.device.type} kernel")
    if drafter.config.norm_before_residual:
        raise LabError("the fused draft_step op runs plain EAGLE-3; this drafter is norm_before_residual")
    args = op_args(drafter, embeds, hidden, positions, k_cache, v_cache, cache_lens, topk, weights)
    return torch.ops.drafter_lab.draft_step(*args)


# Importing this module is what registers the fake kernel: torch's error for a traced or opcheck'd
# call without one names this module (csrc/ops.cpp's set_python_module) but does not import it.
_load()
