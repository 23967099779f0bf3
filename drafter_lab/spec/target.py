"""The target side of speculative decoding: any HF causal LM with its own KV cache, per-row lengths.

The model runs through transformers with a `DynamicCache`. Rows of a batch accept different
numbers of tokens, so each row keeps its own committed length `lens[b]`: slots
`lens[b]:` of the cache are dead for that row and masked out. Every forward gets an explicit
4D additive mask [B, 1, q, kv] (0 = attend, dtype-min = masked) and explicit position ids;
transformers passes a 4D mask through unchanged, and both the `eager` and the `sdpa` attention
implementations apply it (flash/flex attention do not take a dense mask, so the runner switches
those targets to `sdpa`).

- `prefill`: right-padded prompts; query i of row b sees keys j <= i with j < lens[b].
- `verify`: a draft tree of N nodes in one pass; node i of row b sees the row's committed prefix
  and its own ancestors in the tree, at position lens[b] + depth(i).
- `commit`: keep the accepted path of each row. Its entries are moved to slots
  lens[b] .. lens[b] + n_b - 1 (the slots a plain decode would have used, and where their RoPE
  positions point), everything else becomes dead, and the cache is cut to max(lens).
- `join` / `keep` (continuous batching): new rows are prefilled apart and appended, both caches
  padded to the longer one with dead slots; finished rows are dropped.
"""

from __future__ import annotations

import inspect

import torch

from drafter_lab.errors import LabError
from drafter_lab.targets.hidden import run_capturing

DENSE_MASK_ATTENTION = ("eager", "sdpa")


class TargetRunner:
    def __init__(self, model, aux_layer_ids, where=None):
        from transformers import DynamicCache

        self.model = model
        self.aux_ids = [int(i) for i in aux_layer_ids]
        self.where = where
        self._cache_cls = DynamicCache
        params = inspect.signature(type(model).forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_logits = "logits_to_keep" in params
        if getattr(model.config, "_attn_implementation", "eager") not in DENSE_MASK_ATTENTION:
            model.set_attn_implementation("sdpa")
        self.cache = None
        self.lens = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def _mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """bool [B, q, kv] -> additive [B, 1, q, kv] in the model dtype."""
        neg = torch.finfo(self.dtype).min
        zero = torch.zeros((), dtype=self.dtype, device=allowed.device)
        return torch.where(allowed, zero, torch.full((), neg, dtype=self.dtype, device=allowed.device))[:, None]

    def _forward(self, ids, allowed, positions, keep=None, aux=True):
        """keep [B, K]: the positions of each row whose logits are returned ([B, K, V]); None: all."""
        kwargs = {self._cache_kw: self.cache}
        if keep is not None and self._keep_logits:
            # The positions go in as one 1-D list, which every transformers version takes: per-row
            # [B, K] lists came later, and earlier versions broadcast one into [B, B, K, V] logits.
            kept, keep = keep.flatten().unique(return_inverse=True)
            keep = keep.view(ids.shape[0], -1)
            kwargs["logits_to_keep"] = kept
        kwargs.update(input_ids=ids, attention_mask=self._mask(allowed), position_ids=positions, use_cache=True)
        if aux:  # the aux layers' states alone, not all L+1
            out, hs = run_capturing(self.model, self.aux_ids, final=False, **kwargs)
            aux = torch.cat([hs[i] for i in self.aux_ids], -1)
        else:
            out, aux = self.model(**kwargs, output_hidden_states=False), None
        logits = out.logits
        if keep is not None:
            logits = logits.gather(1, keep[..., None].expand(-1, -1, logits.shape[-1]))
        return logits, aux

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, lens: torch.Tensor, aux: bool = True):
        """ids [B, P] right-padded, lens [B] -> (logits at each row's last token [B, V],
        aux hidden states [B, P, 3H] or None without `aux`)."""
        self.cache = self._cache_cls(config=self.model.config)
        B, P = ids.shape
        j = torch.arange(P, device=ids.device)
        allowed = (j[None, None, :] <= j[None, :, None]) & (j[None, None, :] < lens[:, None, None])
        logits, aux = self._forward(ids, allowed, j.expand(B, P), keep=(lens - 1)[:, None], aux=aux)
        self._check_cache()
        self.lens = lens.clone()
        return logits[:, 0], aux

    @torch.no_grad()
    def join(self, ids: torch.Tensor, lens: torch.Tensor, aux: bool = True, append: bool = True):
        """Continuous batching: prefill new rows apart and append them to the batch's rows (with
        `append`; else they are the batch). Both caches are padded to the longer one with dead slots
        (masked: past each row's length)."""
        old, old_lens = self.cache, self.lens
        logits, aux = self.prefill(ids, lens, aux)
        if append:
            S = max(old.get_seq_length(), self.cache.get_seq_length())
            for a, b in zip(old.layers, self.cache.layers):
                for name in ("keys", "values"):
                    setattr(b, name, torch.cat([_pad_seq(getattr(a, name), S), _pad_seq(getattr(b, name), S)]))
            self.lens = torch.cat([old_lens, self.lens])
        return logits, aux

    def keep(self, rows: torch.Tensor) -> None:
        """Only these rows (indices, in this order) stay in the batch; the cache is cut to the longest."""
        self.lens = self.lens[rows]
        S = int(self.lens.max()) if len(rows) else 0
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                setattr(layer, name, getattr(layer, name)[rows, :, :S])

    def _check_cache(self):
        from transformers.cache_utils import DynamicLayer

        for layer in self.cache.layers:
            if type(layer) is not DynamicLayer:
                raise LabError(
                    f"target cache layer {type(layer).__name__} is not supported: speculative decoding "
                    "here needs full-attention layers (DynamicLayer) to roll back rejected tokens",
                    self.where,
                )

    @torch.no_grad()
    def verify(self, tokens: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor, aux: bool = True):
        """One pass over a draft tree: tokens/depth [B, N], ancestors [B, N, N] -> (logits [B, N, V], aux [B, N, 3H])."""
        B, N = tokens.shape
        S = self.cache.get_seq_length()
        prefix = (torch.arange(S, device=tokens.device)[None] < self.lens[:, None])[:, None].expand(B, N, S)
        allowed = torch.cat([prefix, ancestors], -1)
        return self._forward(tokens, allowed, self.lens[:, None] + depth, aux=aux)

    @torch.no_grad()
    def commit(self, path: torch.Tensor, counts: torch.Tensor, verified: int):
        """Keep, per row, the tree nodes path[b, :counts[b]] (local indices) of the last verify of
        `verified` nodes; roll back every other node."""
        col = torch.arange(path.shape[1], device=path.device)[None]
        dest = self.lens[:, None] + col
        src = self.cache.get_seq_length() - verified + path
        # Only entries whose slot changes move: a row as long as the longest whose path is a prefix
        # of the node order (every chain at batch 1) has its tokens in place, and then no layer is touched.
        rows, cols = ((col < counts[:, None]) & (dest != src)).nonzero(as_tuple=True)
        moves = len(rows) > 0
        if moves:
            dest, src = dest[rows, cols], src[rows, cols]
        new_lens = self.lens + counts
        S_new = int(new_lens.max())
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name)
                if moves:
                    t[rows, :, dest] = t[rows, :, src]
                setattr(layer, name, t[:, :, :S_new])
        self.lens = new_lens


def _pad_seq(t: torch.Tensor, length: int) -> torch.Tensor:
    """[B, H, S, D] -> [B, H, length, D], zeros after S."""
    return torch.nn.functional.pad(t, (0, 0, 0, length - t.shape[2]))
