"""How far one model moved from another on the same inputs: per-layer linear CKA and next-token KL.

Linear CKA (Kornblith et al., 2019) compares two sets of representations of the same N inputs:
CKA(X, Y) = ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F * ||Yc^T Yc||_F) with Xc, Yc column-centred. It is 1
for identical inputs, invariant to orthogonal transforms and isotropic scaling of either side, and
works when the widths differ. It is computed from running moments (sums of x, y, x^T x, y^T y,
x^T y in float64), so memory stays at D^2 however many tokens are fed.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class CkaMoments:
    """Running first and second moments of paired rows (x_i, y_i), enough for linear CKA."""

    def __init__(self):
        self.n = 0
        self.sx = self.sy = self.xx = self.yy = self.xy = None
        # Whether x (y) has had two different rows, tracked exactly: the centred moments of constant rows
        # keep a rounding residue (rows of 0.1, say), which read as a CKA of 1 or 0 instead of nan.
        self.x0 = self.y0 = None
        self.x_varies = self.y_varies = False

    def update(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0]:
            raise ValueError(
                f"need paired rows [N, D1] and [N, D2], got {tuple(x.shape)} and {tuple(y.shape)}"
            )
        x, y = x.double(), y.double()
        if len(x):
            if self.x0 is None:
                self.x0, self.y0 = x[0], y[0]
            self.x_varies = self.x_varies or bool((x != self.x0).any())
            self.y_varies = self.y_varies or bool((y != self.y0).any())
        parts = (x.sum(0), y.sum(0), x.T @ x, y.T @ y, x.T @ y)
        if self.n == 0:
            self.sx, self.sy, self.xx, self.yy, self.xy = parts
        else:
            for name, p in zip(("sx", "sy", "xx", "yy", "xy"), parts):
                setattr(self, name, getattr(self, name) + p)
        self.n += x.shape[0]

    def value(self) -> float:
        """Linear CKA of everything fed so far; nan when either side has no variance."""
        n = self.n
        cxx = self.xx - torch.outer(self.sx, self.sx) / n
        cyy = self.yy - torch.outer(self.sy, self.sy) / n
        cxy = self.xy - torch.outer(self.sx, self.sy) / n
        denom = torch.linalg.matrix_norm(cxx) * torch.linalg.matrix_norm(cyy)
        if not (self.x_varies and self.y_varies) or denom.item() <= 0:
            return float("nan")
        return float((cxy.square().sum() / denom).item())


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA between representations x [N, D1] and y [N, D2] of the same N inputs."""
    moments = CkaMoments()
    moments.update(x, y)
    return moments.value()


@torch.no_grad()
def measure_drift(base_model, tuned_model, input_ids_batches: Iterable[torch.Tensor]) -> dict:
    """Compare two HF causal LMs on the same token batches (each LongTensor [B, T], no padding).

    Returns `cka`: linear CKA per HF `hidden_states` index 0..L (0 = embeddings) over all token
    positions; `kl`: mean over positions of KL(base || tuned) of next-token distributions (nats);
    `base_nll` / `tuned_nll`: each model's mean next-token loss on the same tokens; `tokens`.
    """
    moments: list[CkaMoments] | None = None
    kl_sum = nll_base = nll_tuned = 0.0
    positions = predicted = 0
    for ids in input_ids_batches:
        b_out = base_model(input_ids=ids.to(_device(base_model)), output_hidden_states=True)
        t_out = tuned_model(input_ids=ids.to(_device(tuned_model)), output_hidden_states=True)
        if len(b_out.hidden_states) != len(t_out.hidden_states):
            raise ValueError("base and tuned have different numbers of layers")
        if moments is None:
            moments = [CkaMoments() for _ in b_out.hidden_states]
        for m, hb, ht in zip(moments, b_out.hidden_states, t_out.hidden_states):
            m.update(hb.flatten(0, 1), ht.flatten(0, 1).to(hb.device))
        logp_b = torch.log_softmax(b_out.logits.double(), -1)
        logp_t = torch.log_softmax(t_out.logits.double().to(logp_b.device), -1)
        kl_sum += (logp_b.exp() * (logp_b - logp_t)).sum().item()
        target = ids[:, 1:].to(logp_b.device)
        nll_base -= logp_b[:, :-1].gather(-1, target[..., None]).sum().item()
        nll_tuned -= logp_t[:, :-1].gather(-1, target[..., None]).sum().item()
        positions += ids.numel()
        predicted += target.numel()
    if moments is None:
        raise ValueError("measure_drift needs at least one batch")
    return {
        "cka": [m.value() for m in moments],
        "kl": kl_sum / positions,
        "base_nll": nll_base / predicted,
        "tuned_nll": nll_tuned / predicted,
        "tokens": positions,
    }


def _device(model) -> torch.device:
    return next(model.parameters()).device
