"""Where a training run's sequences come from.

`Captured`: shards that `data prepare` (or `data import-specforge`) wrote. Only the target's
embedding and lm_head are loaded; the features are read a batch at a time.

`Online`: the target itself, run inside `train` on each batch's sequences (SpecForge's "online"
mode). Nothing is written to disk, at the price of a target forward per sequence per epoch and the
whole target in memory: the choice for a target whose features would take more disk than a few
epochs of forwards take time. The sequences, the split and the states are capture's own (same chat
template, loss mask, aux layers and hash split), so a drafter trained either way sees the same data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from drafter_lab import atomic
from drafter_lab.data.capture import (
    DTYPES,
    CaptureConfig,
    capture_states,
    check_config,
    split_of,
    tokenize_conversations,
)
from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.shards import SPLITS, FeatureSet, Sequence
from drafter_lab.data.vocab import count_train_tokens
from drafter_lab.errors import LabError
from drafter_lab.progress import maybe_progress
from drafter_lab.targets.hf import check_aux_layer_ids, default_aux_layer_ids, load_target, load_target_head


class Captured:
    """Features captured from the target beforehand, located now and read per batch."""

    def __init__(self, target_dir: Path, data_dir: Path, scan: bool, rank: int = 0, world: int = 1, target=None):
        self.where = data_dir
        # Embedding + lm_head (the layers never run here), unless the caller has them loaded already.
        self.target = target or load_target_head(target_dir)
        fs = self.features = FeatureSet(data_dir)
        fs.check_target(self.target.fingerprint, target_dir)
        if fs.hidden_size != self.target.hidden_size:
            raise LabError(f"features have hidden size {fs.hidden_size}, the target {self.target.hidden_size}: "
                           "they do not fit", data_dir)
        self.aux_layer_ids = fs.manifest.aux_layer_ids
        self.items = {s: fs.require(s) for s in SPLITS}  # located, not read
        self.read = None  # Examples reads the shards itself
        if scan:
            self._scan(rank, world)

    def _scan(self, rank: int, world: int) -> None:
        """Every shard read once before anything is written; ranks split the shards."""
        fs = self.features
        rows = [r for split in SPLITS for r in fs.manifest.shards.get(split, [])][rank::world]
        with maybe_progress("check features", len(rows), rank == 0) as advance:
            for r in rows:
                fs.reader.scan(fs.dir / r["file"])
                advance(1)

    def token_counts(self) -> torch.Tensor:
        return count_train_tokens(self.where)

    def identity(self) -> dict:
        """What the run's data is, without where it lies: a resume must see the same."""
        return {"manifest_sha256": atomic.sha256_file(self.features.dir / "manifest.json")}

    def describe(self) -> dict:
        """Where the data lies (for run.json, beside its identity)."""
        return {"dir": str(self.where)}


@dataclass(frozen=True)
class Prompt:
    """A tokenized conversation whose hidden states are computed when its batch is."""

    seq_id: str
    input_ids: torch.Tensor
    loss_mask: torch.Tensor

    def __len__(self) -> int:
        return len(self.input_ids)


class Online:
    """Conversations run through the whole target, a batch at a time, as training reads them."""

    def __init__(self, target_dir: Path, conversations: Path, capture: CaptureConfig, device: torch.device,
                 val_cache_mb: float = 0.0):
        check_config(capture)
        if capture.regenerate:
            raise LabError("online training does not regenerate: run `data regenerate` first, then train on its output")
        self.where, self.capture = conversations, capture
        self.dtype = DTYPES[capture.dtype]
        self.target = load_target(target_dir, device=device, dtype=self.dtype)
        n = self.target.num_layers
        self.aux_layer_ids = check_aux_layer_ids(
            capture.aux_layer_ids if capture.aux_layer_ids is not None else default_aux_layer_ids(n), n, target_dir)
        convs, skipped = read_conversations(conversations, strict=capture.strict)
        items = tokenize_conversations(self.target.tokenizer, convs, capture, conversations, skipped)
        if not items:
            raise LabError(f"no conversation keeps an assistant token within max_length={capture.max_length}",
                           conversations)
        self.items = {s: [Prompt(*it) for it in items if split_of(it[0], capture.val_fraction) == s] for s in SPLITS}
        self.skipped = skipped
        # Validation reads the same batches every time: their states, once computed, can be kept.
        val_bytes = sum(map(len, self.items["val"])) * 4 * self.target.hidden_size * self.dtype.itemsize
        self.kept: dict[str, Sequence] | None = {} if 0 < val_bytes <= val_cache_mb * 2**20 else None
        self._val_ids = {p.seq_id for p in self.items["val"]}

    def read(self, prompts: list[Prompt]) -> list[Sequence]:
        """The prompts' states, from one target forward over all of them (capture's batching), or
        from memory for a validation batch computed before."""
        kept = self.kept
        if kept is not None and prompts and all(p.seq_id in kept for p in prompts):
            return [kept[p.seq_id] for p in prompts]
        out: list[Sequence | None] = [None] * len(prompts)
        items = [(p.seq_id, p.input_ids, p.loss_mask) for p in prompts]
        capture_states(self.target, items, self.aux_layer_ids, self.dtype, max(len(items), 1),
                       lambda *_, **__: None, out.__setitem__)
        if kept is not None:
            kept.update((seq.seq_id, seq) for seq in out if seq.seq_id in self._val_ids)
        return out

    def token_counts(self) -> torch.Tensor:
        ids = [p.input_ids[p.loss_mask] for p in self.items["train"]]
        counts = torch.bincount(torch.cat(ids) if ids else torch.zeros(0, dtype=torch.long),
                                minlength=self.target.vocab_size)
        if not counts.any():
            raise LabError("no train conversation has an assistant token: nothing to build a vocabulary from",
                           self.where)
        return counts

    def identity(self) -> dict:
        """What the run's data is, without where it lies: a resume must see the same."""
        c = self.capture
        return {"sha256": atomic.sha256_file(self.where), "max_length": c.max_length, "dtype": c.dtype,
                "aux_layer_ids": self.aux_layer_ids, "val_fraction": c.val_fraction}

    def describe(self) -> dict:
        """Where the data lies and what was skipped (for run.json, beside its identity)."""
        return {"online": str(self.where), "skipped": self.skipped}
