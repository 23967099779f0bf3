"""On-disk format of captured target features: safetensors shards plus `manifest.json`.

A feature directory holds `<split>-<NNNNN>.safetensors` shards. Each shard packs its sequences
end to end with an `offsets` index, so sequence i spans tokens offsets[i]:offsets[i+1]:

    input_ids     int32   [T]          token ids
    loss_mask     uint8   [T]          1 on assistant tokens (the positions that train the drafter)
    aux_hidden    dtype   [T, 3*H]     the three aux hidden states, concatenated in aux-id order
    final_hidden  dtype   [T, H]       last entry of HF hidden_states (after the final norm);
                                       target logits = lm_head(final_hidden), recomputed on read
    offsets       int64   [S+1]

The shard's safetensors metadata holds `seq_ids` (JSON list). The manifest lists finished shards
with their sha256; it is rewritten atomically after every shard, so a killed capture resumes by
skipping what the manifest already lists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from drafter_lab import atomic
from drafter_lab.errors import LabError

FORMAT = "drafter_lab.features/1"
MANIFEST = "manifest.json"
AUX_CONVENTION = "hf_hidden_states"  # index 0 = embeddings, index i = output of layer i-1
SPLITS = ("train", "val")


@dataclass
class Sequence:
    """One captured sequence (all tensors on CPU)."""

    seq_id: str
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    aux_hidden: torch.Tensor
    final_hidden: torch.Tensor


@dataclass
class Manifest:
    """What a feature directory holds and which target made it."""

    target: dict
    """Target.describe(): path, fingerprint, architecture, num_layers, hidden_size, vocab_size."""
    aux_layer_ids: list[int]
    """Indices into HF output_hidden_states (convention AUX_CONVENTION)."""
    dtype: str
    """Storage dtype of the hidden states, e.g. "float32" or "bfloat16"."""
    source: dict = field(default_factory=dict)
    """Where the sequences came from: conversations file, its sha256, max_length, regeneration."""
    shards: dict = field(default_factory=lambda: {s: [] for s in SPLITS})
    """Per split, the finished shards: {file, sequences, tokens, loss_tokens, sha256}."""
    skipped: dict = field(default_factory=dict)
    """Counts of conversations skipped and why (e.g. no assistant turn)."""
    format: str = FORMAT
    aux_convention: str = AUX_CONVENTION

    def counts(self, split: str) -> dict:
        rows = self.shards.get(split, [])
        return {
            "sequences": sum(r["sequences"] for r in rows),
            "tokens": sum(r["tokens"] for r in rows),
            "loss_tokens": sum(r["loss_tokens"] for r in rows),
        }

    def to_json(self) -> dict:
        return {
            "format": self.format,
            "target": self.target,
            "aux_layer_ids": self.aux_layer_ids,
            "aux_convention": self.aux_convention,
            "dtype": self.dtype,
            "source": self.source,
            "shards": self.shards,
            "skipped": self.skipped,
            "counts": {s: self.counts(s) for s in SPLITS},
        }

    def save(self, directory) -> None:
        atomic.write_json(Path(directory) / MANIFEST, self.to_json())

    @classmethod
    def load(cls, directory) -> Manifest:
        path = Path(directory) / MANIFEST
        data = atomic.read_json(path, "not a feature directory: manifest.json is missing", directory)
        if data.get("format") != FORMAT:
            raise LabError(f"unknown feature format {data.get('format')!r} (want {FORMAT})", path)
        data.pop("counts", None)
        return cls(**data)


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.safetensors"


def write_shard(directory, split: str, index: int, sequences: list[Sequence], dtype: torch.dtype) -> dict:
    """Write one shard atomically; returns its manifest row."""
    if not sequences:
        raise ValueError("empty shard")
    lengths = [len(s.input_ids) for s in sequences]
    offsets = torch.zeros(len(sequences) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    tensors = {
        "input_ids": torch.cat([s.input_ids for s in sequences]).to(torch.int32),
        "loss_mask": torch.cat([s.loss_mask for s in sequences]).to(torch.uint8),
        "aux_hidden": torch.cat([s.aux_hidden for s in sequences]).to(dtype),
        "final_hidden": torch.cat([s.final_hidden for s in sequences]).to(dtype),
        "offsets": offsets,
    }
    name = shard_name(split, index)
    path = Path(directory) / name
    atomic.save_safetensors(tensors, path, metadata={"seq_ids": json.dumps([s.seq_id for s in sequences])})
    return {
        "file": name,
        "sequences": len(sequences),
        "tokens": int(offsets[-1]),
        "loss_tokens": int(tensors["loss_mask"].sum()),
        "sha256": atomic.sha256_file(path),
    }


def read_shard(path, check_finite: bool = True) -> list[Sequence]:
    """Read a shard; a truncated or corrupt file, or NaN/inf features, is a LabError naming it."""
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            t = {k: f.get_tensor(k) for k in f.keys()}
    except FileNotFoundError:
        raise LabError("feature shard is missing", path) from None
    except Exception as e:
        raise LabError(f"truncated or corrupt feature shard ({str(e).splitlines()[0][:200]})", path) from None
    need = {"input_ids", "loss_mask", "aux_hidden", "final_hidden", "offsets"}
    if not need <= t.keys():
        raise LabError(f"feature shard lacks {sorted(need - t.keys())}", path)
    if check_finite:
        for key in ("aux_hidden", "final_hidden"):
            if not torch.isfinite(t[key]).all():
                raise LabError(f"NaN or inf in {key}: refusing to train on it", path)
    seq_ids = json.loads(meta.get("seq_ids", "[]"))
    offsets = t["offsets"].tolist()
    out = []
    for i in range(len(offsets) - 1):
        a, b = offsets[i], offsets[i + 1]
        out.append(
            Sequence(
                seq_id=seq_ids[i] if i < len(seq_ids) else str(i),
                input_ids=t["input_ids"][a:b].long(),
                loss_mask=t["loss_mask"][a:b].bool(),
                aux_hidden=t["aux_hidden"][a:b],
                final_hidden=t["final_hidden"][a:b],
            )
        )
    return out


class FeatureSet:
    """A feature directory opened for reading."""

    def __init__(self, directory):
        self.dir = Path(directory)
        if not self.dir.is_dir():
            raise LabError("feature directory not found", self.dir)
        self.manifest = Manifest.load(self.dir)

    @property
    def hidden_size(self) -> int:
        return int(self.manifest.target["hidden_size"])

    @property
    def fingerprint(self) -> str:
        return self.manifest.target["fingerprint"]

    def check_target(self, target_fingerprint: str, target_path=None) -> None:
        """Features made by another target than the one given are refused."""
        if target_fingerprint != self.fingerprint:
            raise LabError(
                f"features were captured from target {self.fingerprint} "
                f"({self.manifest.target.get('path')}), not from {target_path or ''} ({target_fingerprint})",
                self.dir,
            )

    def sequences(self, split: str) -> list[Sequence]:
        rows = self.manifest.shards.get(split, [])
        planned = self.manifest.source.get("planned", {}).get(split, {}).get("shards", 0)
        if len(rows) < planned:  # a killed `data prepare`: training on part of it would be silently different
            raise LabError(
                f"partial capture: {split} has {len(rows)} of {planned} shards; run the same "
                "`drafter-lab data prepare` again to finish it",
                self.dir,
            )
        return [s for r in rows for s in read_shard(self.dir / r["file"])]

    def require(self, split: str) -> list[Sequence]:
        seqs = self.sequences(split)
        if not seqs or not any(bool(s.loss_mask.any()) for s in seqs):
            raise LabError(f"no {split} sequences with loss tokens: nothing to train or evaluate on", self.dir)
        return seqs
