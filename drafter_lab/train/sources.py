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

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from drafter_lab import atomic
from drafter_lab.data.capture import (
    DTYPES,
    CaptureConfig,
    capture_states,
    check_config,
    conversation_of,
    pinned_by_rank0,
    sampled_at,
    split_of,
    temperature_of,
    tokenize_conversations,
)
from drafter_lab.data.capture_config import ENCODED_HASH
from drafter_lab.data.chat import rendered_with
from drafter_lab.data.conversations import conversations_sha256, read_conversations
from drafter_lab.data.shards import SPLITS, FeatureSet, Sequence, SequenceRef
from drafter_lab.data.vocab import count_train_tokens
from drafter_lab.errors import LabError
from drafter_lab.progress import log, maybe_progress
from drafter_lab.targets.hf import check_aux_layer_ids, default_aux_layer_ids, load_target, load_target_head


def _open_features(data_dir: Path, target) -> FeatureSet:
    fs = FeatureSet(data_dir)
    fs.check_target(target)
    if fs.hidden_size != target.hidden_size:
        raise LabError(f"features have hidden size {fs.hidden_size}, the target {target.hidden_size}: "
                       "they do not fit", data_dir)
    return fs


def _scan(sets: list[FeatureSet], vocab_size: int, rank: int, world: int) -> None:
    """Every shard read once before anything is written, its token ids checked to lie in the
    target's `vocab_size`; ranks split the shards."""
    shards = [(fs, fs.dir / r["file"]) for fs in sets for split in SPLITS for r in fs.manifest.shards.get(split, [])]
    with maybe_progress("check features", len(shards[rank::world]), rank == 0) as advance:
        for fs, path in shards[rank::world]:
            fs.reader.scan(path, vocab_size)
            advance(1)


class HeldOutFeatures:
    """A validation set of its own: every sequence (both splits) of a feature directory captured
    from the training target with the same aux layers."""

    def __init__(self, val_dir: Path, target, aux_layer_ids: list[int]):
        self.features = fs = _open_features(val_dir, target)
        if fs.manifest.aux_layer_ids != aux_layer_ids:
            raise LabError(f"validation features hold aux layers {fs.manifest.aux_layer_ids}, the training data "
                           f"{aux_layer_ids}: they do not fit", val_dir)
        if not any(fs.manifest.counts(s)["loss_tokens"] for s in SPLITS):
            raise LabError("no sequences with loss tokens: nothing to validate on", val_dir)
        self.items: list[SequenceRef] = [ref for s in SPLITS for ref in fs.index(s)]
        self.sampled_at = sampled_at(fs.manifest.source)
        """The temperature its assistant tokens were sampled at by the target itself, else None."""

    def identity(self) -> dict:
        return {"manifest_sha256": atomic.sha256_file(self.features.dir / "manifest.json")}

    def describe(self) -> dict:
        return {"val_data": str(self.features.dir)}


@dataclass
class HeldOutConversations:
    """A validation set of its own for an online run: every conversation of a file, tokenized as
    the training ones (Online._prompts)."""

    path: Path
    items: list[Prompt]
    skipped: dict

    def identity(self) -> dict:
        return {"sha256": conversations_sha256(self.path)}

    def describe(self) -> dict:
        return {"val_data": str(self.path), "val_skipped": self.skipped}


class Captured:
    """Features captured from the target beforehand, located now and read per batch."""

    def __init__(self, target_dir: Path, data_dir: Path, scan: bool, rank: int = 0, world: int = 1, target=None,
                 val_data: Path | str | None = None):
        self.where = data_dir
        val_data = None if val_data is None else Path(val_data)  # a str too, as train() and `data_dir` take it
        # Embedding + lm_head (the layers never run here), unless the caller has them loaded already.
        self.target = target or load_target_head(target_dir)
        fs = self.features = _open_features(data_dir, self.target)
        self.aux_layer_ids = fs.manifest.aux_layer_ids
        self.held_out = None
        if val_data is not None:
            if val_data.is_file():
                raise LabError("a run on captured features validates on a feature directory, not a file: "
                               "capture it with `data prepare`", val_data)
            self.held_out = HeldOutFeatures(val_data, self.target, self.aux_layer_ids)
            same = atomic.sha256_file(val_data / "manifest.json") == atomic.sha256_file(fs.dir / "manifest.json")
            if same:  # a copy of --data, say
                raise LabError("--val-data holds the same features as --data: validation would score what the "
                               "drafter trains on", val_data)
        self.items = {"train": fs.require("train"),  # located, not read
                      "val": self.held_out.items if self.held_out else fs.require("val")}
        self.reads = {"train": None, "val": None}  # Examples reads the shards itself
        self.val_sampled_at = self.held_out.sampled_at if self.held_out else sampled_at(fs.manifest.source)
        """The temperature the val sequences' assistant tokens were sampled at by the target, else None."""
        if scan:
            _scan([fs, *([self.held_out.features] if self.held_out else [])], self.target.vocab_size, rank, world)

    def token_counts(self) -> torch.Tensor:
        return count_train_tokens(self.where)

    def identity(self) -> dict:
        """What the run's data is, without where it lies: a resume must see the same."""
        out = {"manifest_sha256": atomic.sha256_file(self.features.dir / "manifest.json")}
        return {**out, "val": self.held_out.identity()} if self.held_out else out

    def describe(self) -> dict:
        """Where the data lies (for run.json, beside its identity)."""
        return {"dir": str(self.where), **(self.held_out.describe() if self.held_out else {})}


@dataclass(frozen=True)
class Prompt:
    """A tokenized conversation whose hidden states are computed when its batch is."""

    seq_id: str
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    sampled_at: float | None = None
    """The temperature its answers' tokens were sampled at by the target (token-exact), else None."""

    def __len__(self) -> int:
        return len(self.input_ids)


def encoded_sha256(prompts: list[Prompt]) -> str:
    """A hash of the sequences conversations encoded to: their ids, tokens and loss masks."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(p.seq_id.encode() + b"\0")
        h.update(p.input_ids.to(torch.int32).numpy().tobytes())
        h.update(p.loss_mask.numpy().tobytes())
    return h.hexdigest()[:16]


class Online:
    """Conversations run through the whole target, a batch at a time, as training reads them."""

    def __init__(self, target_dir: Path, conversations: Path, capture: CaptureConfig, device: torch.device,
                 val_cache_mb: float = 0.0, val_data: Path | str | None = None, scan: bool = True, rank: int = 0,
                 world: int = 1, rendered: dict | None = None):
        """`rendered`: how the run this one resumes rendered its conversations (its run.json's features)."""
        check_config(capture)
        if capture.regenerate:
            raise LabError("online training does not regenerate: run `data regenerate` first, then train on its output")
        self.where, self.capture, self.main = conversations, capture, rank == 0
        self.dtype = DTYPES[capture.dtype]
        # Both files read before the whole target loads: a file with nothing to train on fails at once.
        self.skipped: dict = {}
        convs = self._read(conversations, self.skipped)
        val_data = None if val_data is None else Path(val_data)  # a str too, as train() and `conversations` take it
        val_file = val_data is not None and not val_data.is_dir()
        if val_file:
            val_skipped: dict = {}
            val_convs = self._read(val_data, val_skipped)
            # A copy under another path (the same path is train()'s to refuse).
            if val_data.resolve() != Path(conversations).resolve() and \
                    conversations_sha256(val_data) == conversations_sha256(conversations):
                raise LabError("--val-data holds the same conversations as --conversations: validation would score "
                               "what the drafter trains on", val_data)
        self.target = load_target(target_dir, device=device, dtype=self.dtype)
        # A template that reads the clock renders one day throughout, recorded in identity(): the resumed run's.
        self.capture = capture = replace(capture, chat_template_kwargs=pinned_by_rank0(
            self.target.tokenizer, capture.chat_template_kwargs, [rendered]))
        n = self.target.num_layers
        self.aux_layer_ids = check_aux_layer_ids(
            capture.aux_layer_ids if capture.aux_layer_ids is not None else default_aux_layer_ids(n), n, target_dir)
        items = self._prompts(conversations, convs, self.skipped)
        self.items = {s: [p for p in items if split_of(p.seq_id, capture.val_fraction) == s] for s in SPLITS}
        if not self.items["train"]:
            raise LabError(f"no conversation falls in the train split (--val-fraction {capture.val_fraction}), nothing "
                           "to train on: lower it, or add conversations", conversations)
        self.held_out: HeldOutFeatures | HeldOutConversations | None = None
        if val_data is not None and val_data.is_dir():
            self.held_out = HeldOutFeatures(val_data, self.target, self.aux_layer_ids)
            if scan:
                _scan([self.held_out.features], self.target.vocab_size, rank, world)
        elif val_file:
            self.held_out = HeldOutConversations(val_data, self._prompts(val_data, val_convs, val_skipped), val_skipped)
            self._note_overlap()
        elif not self.items["val"]:
            raise LabError(f"no conversation falls in the val split (--val-fraction {capture.val_fraction}), nothing "
                           "to validate on: raise it, or pass --val-data", conversations)
        if self.held_out:
            self.items["val"] = self.held_out.items
        # Held-out features are read from their shards; conversations go through the target.
        self.reads = {"train": self.read, "val": None if isinstance(self.held_out, HeldOutFeatures) else self.read_val}
        if isinstance(self.held_out, HeldOutFeatures):
            self.val_sampled_at = self.held_out.sampled_at
        else:  # the val conversations' own tokens replay a sampled server when all were sampled at one temperature
            temps = {p.sampled_at for p in self.items["val"]}
            self.val_sampled_at = temps.pop() if len(temps) == 1 else None
        # Validation reads the same batches every time: their states, once computed, can be kept.
        val_bytes = sum(map(len, self.items["val"])) * 4 * self.target.hidden_size * self.dtype.itemsize
        keep = self.reads["val"] is not None and 0 < val_bytes <= val_cache_mb * 2**20
        self.kept: dict[str, Sequence] | None = {} if keep else None

    def _read(self, path: Path, skipped: dict) -> list:
        convs, counts = read_conversations(path, strict=self.capture.strict)
        skipped.update(counts)
        if not convs:
            raise LabError(f"no conversation with an assistant turn (skipped: {counts})", path)
        return convs

    def _prompts(self, path: Path, convs: list, skipped: dict) -> list[Prompt]:
        items = tokenize_conversations(self.target, convs, self.capture, path, skipped, self.main)
        if not items:
            raise LabError(f"no conversation keeps an assistant token within max_length={self.capture.max_length} "
                           f"(skipped: {skipped})", path)
        temps = {c.id: temperature_of([c]) for c in convs} if self.capture.token_exact else {}
        # Only per-turn ids carry a `#turn<k>` of the lab's: a conversation's own id may end so too.
        per_turn = self.capture.turns == "each"
        return [Prompt(*it, sampled_at=temps.get(conversation_of(it[0]) if per_turn else it[0])) for it in items]

    def _note_overlap(self) -> None:
        """A held-out file sharing sequences with the train split scores some of what the drafter
        trains on: said, with how many (a shared conversation is common in scraped chat data)."""
        def key(p: Prompt) -> tuple[bytes, bytes]:
            return p.input_ids.to(torch.int32).numpy().tobytes(), p.loss_mask.numpy().tobytes()

        trained = {key(p) for p in self.items["train"]}
        shared = sum(key(p) in trained for p in self.held_out.items)
        if shared and self.main:
            log(f"{self.held_out.path}: {shared} of {len(self.held_out.items)} validation sequences are also train "
                f"sequences of {self.where}: validation scores them on what the drafter trains on")

    def read(self, prompts: list[Prompt]) -> list[Sequence]:
        """The prompts' states, from one target forward over all of them (capture's batching)."""
        out: list[Sequence | None] = [None] * len(prompts)
        items = [(p.seq_id, p.input_ids, p.loss_mask) for p in prompts]
        capture_states(self.target, items, self.aux_layer_ids, self.dtype, max(len(items), 1),
                       lambda *_, **__: None, out.__setitem__)
        return out

    def read_val(self, prompts: list[Prompt]) -> list[Sequence]:
        """`read` for validation batches, from memory for one computed before (when they fit)."""
        kept = self.kept
        if kept is not None and prompts and all(p.seq_id in kept for p in prompts):
            return [kept[p.seq_id] for p in prompts]
        out = self.read(prompts)
        if kept is not None:
            kept.update((seq.seq_id, seq) for seq in out)
        return out

    def token_counts(self) -> torch.Tensor:
        # never empty: __init__ refuses an empty train split, and every kept sequence has a loss token
        return torch.bincount(torch.cat([p.input_ids[p.loss_mask] for p in self.items["train"]]),
                              minlength=self.target.vocab_size)

    def identity(self) -> dict:
        """What the run's data is, without where it lies: a resume must see the same."""
        c = self.capture
        out = {"sha256": conversations_sha256(self.where), "max_length": c.max_length, "dtype": c.dtype,
               "aux_layer_ids": self.aux_layer_ids, "val_fraction": c.val_fraction,
               **({"token_exact": True} if c.token_exact else {}),  # absent otherwise: older runs still resume
               **({"turns": c.turns} if c.turns != "all" else {}),  # likewise
               **rendered_with(self.target.tokenizer, c.chat_template_kwargs)}
        val = [] if isinstance(self.held_out, HeldOutFeatures) else self.items["val"]  # features: their manifest's
        out[ENCODED_HASH] = encoded_sha256([*self.items["train"], *val])
        return {**out, "val": self.held_out.identity()} if self.held_out else out

    def describe(self) -> dict:
        """Where the data lies and what was skipped (for run.json, beside its identity)."""
        return {"online": str(self.where), "skipped": self.skipped, **(self.held_out.describe() if self.held_out else {})}
