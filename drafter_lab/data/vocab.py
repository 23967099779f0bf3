"""Draft vocabulary (DESIGN section 3): which target tokens the drafter's lm_head can propose.

Count target-token frequencies over loss-masked (assistant) positions of the train split, take the
top N, sort ascending -> `used`. `d2t[i] = used[i] - i` (int64; target id = i + d2t[i]) and `t2d`
is a bool mask over the target vocab, so `nonzero(t2d) == d2t + arange(N)`. When fewer than N
tokens occur, the lowest unused ids pad the list. `(d2t, t2d, lm_head rows)` travel together: a
mapping never replaces a checkpoint's without re-indexing its lm_head (drafter.transfer does that).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from drafter_lab import atomic
from drafter_lab.data.shards import MANIFEST, FeatureSet, check_token_ids
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import first_line

FORMAT = "drafter_lab.vocab/1"


def check_replaceable(path) -> None:
    """Refuse to write a vocab over a file that is not one: a vocab is rebuilt in place, any other file
    is someone's data. A drafter's weights file also holds d2t and t2d (and reads as a vocabulary), so
    the file's tensor names decide, from its header."""
    if not Path(path).exists():
        return
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            others = set(f.keys()) - {"d2t", "t2d"}
    except Exception:  # not safetensors (a manifest.json, say)
        others = {"?"}
    if others:
        raise LabError("exists and is not a draft vocabulary (it holds more than d2t and t2d): give another --out "
                       "(it is not overwritten)", path)


@dataclass
class DraftVocab:
    """The (d2t, t2d) pair of one draft vocabulary."""

    d2t: torch.Tensor
    """int64 [N]: offset from draft id to target id (target id = i + d2t[i])."""
    t2d: torch.Tensor
    """bool [V_target]: True where the target token has a draft id."""

    @property
    def size(self) -> int:
        return int(self.d2t.numel())

    @property
    def target_vocab_size(self) -> int:
        return int(self.t2d.numel())

    @property
    def used(self) -> torch.Tensor:
        """Target ids of the draft positions (int64 [N]; ascending in every vocabulary the lab builds)."""
        return self.d2t + torch.arange(self.size, dtype=torch.int64)

    @classmethod
    def from_used(cls, used: torch.Tensor, target_vocab_size: int) -> DraftVocab:
        used = torch.sort(used.to(torch.int64)).values
        t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
        t2d[used] = True
        return cls(d2t=used - torch.arange(used.numel(), dtype=torch.int64), t2d=t2d)

    def save(self, path) -> None:
        """Write (or rewrite) a vocab file; any other file is refused (check_replaceable)."""
        check_replaceable(path)
        atomic.save_safetensors(
            {"d2t": self.d2t, "t2d": self.t2d},
            path,
            metadata={
                "format": FORMAT,
                "draft_vocab_size": str(self.size),
                "target_vocab_size": str(self.target_vocab_size),
            },
        )

    @classmethod
    def load(cls, path) -> DraftVocab:
        """Read a vocab file (`save`'s; a drafter directory's mapping: drafter.checkpoint.read_vocab)."""
        from safetensors import safe_open

        path = Path(path)
        try:
            with safe_open(str(path), framework="pt") as f:
                missing = [k for k in ("d2t", "t2d") if k not in f.keys()]
                if missing:
                    raise LabError(f"no {' or '.join(missing)} tensor: not a draft vocabulary", path)
                d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
        except LabError:
            raise
        except FileNotFoundError:
            raise LabError("draft vocabulary file not found", path) from None
        except Exception as e:
            raise LabError(f"truncated or corrupt safetensors ({first_line(e)})", path) from None
        return cls.checked(d2t, t2d, path)

    @classmethod
    def checked(cls, d2t: torch.Tensor, t2d: torch.Tensor, where, t2d_where=None) -> DraftVocab:
        """The pair read from a file, refused (naming `where`, or `t2d_where` for t2d alone: a sharded
        drafter's other file) unless t2d marks exactly the target tokens d2t maps to, each once. Order
        is d2t's own: engines index lm_head rows through it."""
        if d2t.dim() != 1 or d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
            raise LabError(f"d2t must be a 1-D integer tensor, got {d2t.dtype} {list(d2t.shape)}", where)
        if t2d.dim() != 1 or t2d.dtype.is_floating_point or (t2d.dtype != torch.bool and t2d.numel()
                                                             and not 0 <= t2d.min() <= t2d.max() <= 1):
            raise LabError(f"t2d must be a 1-D bool mask, got {t2d.dtype} {list(t2d.shape)}", t2d_where or where)
        if not d2t.numel():  # else a drafter built on it has an lm_head of 0 rows, proposing nothing
            raise LabError("d2t is empty: a draft vocabulary of 0 tokens", where)
        vocab = cls(d2t=d2t.to(torch.int64), t2d=t2d.bool())
        used, v = vocab.used, vocab.target_vocab_size
        if used.numel() and (used.min() < 0 or used.max() >= v):
            raise LabError(f"d2t maps draft ids outside the target vocab (0..{v - 1})", where)
        if torch.unique(used).numel() != used.numel():
            raise LabError("d2t maps two draft ids to the same target token", where)
        marked, unmarked = int(vocab.t2d.sum()), int((~vocab.t2d[used]).sum())
        if marked != used.numel() or unmarked:
            raise LabError(f"d2t and t2d disagree: t2d marks {marked} target tokens; of the {used.numel()} that "
                           f"d2t maps to, {unmarked} are not marked", where)
        return vocab

    @classmethod
    def of_drafter_file(cls, d2t: torch.Tensor | None, t2d: torch.Tensor | None, size: int,
                        target_vocab_size: int, where, t2d_where=None) -> DraftVocab:
        """A drafter checkpoint's mapping, read as SGLang and vLLM read it: they map draft ids through
        d2t alone, as the identity when a file has none (so only a whole-vocabulary drafter may leave
        it out), and never read t2d (derived from d2t here when a file has none)."""
        if d2t is None:
            if size != target_vocab_size:
                raise LabError(f"no 'd2t' tensor, yet the draft vocab ({size}) is not the target's "
                               f"({target_vocab_size}): its draft ids cannot be mapped to target ids", where)
            d2t = torch.zeros(size, dtype=torch.int64)
        if t2d is None:
            used = d2t.to(torch.int64) + torch.arange(d2t.numel(), dtype=torch.int64)
            t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
            t2d[used[(used >= 0) & (used < target_vocab_size)]] = True
        for name, t, want, key, file in (("d2t", d2t, size, "draft_vocab_size", where),
                                         ("t2d", t2d, target_vocab_size, "vocab_size", t2d_where or where)):
            if t.numel() != want:
                raise LabError(f"{name} has {t.numel()} entries, the config's {key} is {want}", file)
        return cls.checked(d2t, t2d, where, t2d_where)


def vocab_of_drafter(drafter) -> DraftVocab:
    """The mapping a loaded drafter carries (any module with `d2t`/`t2d` buffers)."""
    return DraftVocab(d2t=drafter.d2t.detach().long().cpu(), t2d=drafter.t2d.detach().bool().cpu())


def recorded_vocab_size(features: FeatureSet) -> int:
    """The target vocab size a feature set's manifest records; one line naming it when absent or not
    a positive integer (the manifest's shape check lets it be absent)."""
    vocab_size = features.vocab_size
    if vocab_size is None or vocab_size < 1:
        got = features.manifest.target.get("vocab_size")  # as written, where it is no integer
        raise LabError(f"'target' records no vocab_size (an integer >= 1), got {got!r}: the token counts "
                       "of a draft vocabulary need it", features.dir / MANIFEST)
    return vocab_size


def count_train_tokens(feature_dir) -> torch.Tensor:
    """Per target token, how often it sits at a loss-masked position of the train split (int64 [V]).
    `feature_dir` may be a FeatureSet opened already (its manifest read once, not again here)."""
    features = feature_dir if isinstance(feature_dir, FeatureSet) else FeatureSet(feature_dir)
    vocab_size = recorded_vocab_size(features)
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    features.index("train")  # each shard as its manifest row says (headers only), before its rows are counted
    for row in features.shards("train"):
        path = features.dir / row["file"]
        # only the two small tensors: the hidden states are not needed here
        ids, mask = (features.reader.rows(path, key, 0, row["tokens"]) for key in ("input_ids", "loss_mask"))
        ids = ids[mask.bool()].long()
        check_token_ids(ids, vocab_size, path)
        counts += torch.bincount(ids, minlength=vocab_size)
    if not counts.any():
        raise LabError("no loss-masked tokens in the train split: nothing to build a vocabulary from", features.dir)
    return counts


def check_size(size: int, vocab_size: int | None, name: str = "draft vocab size") -> None:
    """A draft vocab of `size` tokens: at least one, and no more than the target's `vocab_size` (None: not
    known yet, so that a bad `vocab build --size` is refused before the features are opened)."""
    if size < 1 or (vocab_size is not None and size > vocab_size):
        bounds = ">= 1" if vocab_size is None else f"in 1..{vocab_size} (the target vocab size)"
        raise LabError(f"{name} must be {bounds}, got {size}")


def vocab_from_counts(counts: torch.Tensor, size: int) -> DraftVocab:
    """Top `size` tokens by count (ties: lower id first), padded with the lowest unused ids."""
    vocab_size = int(counts.numel())
    check_size(size, vocab_size)
    order = torch.sort(counts, descending=True, stable=True).indices
    seen = order[counts[order] > 0][:size]
    if seen.numel() < size:
        free = torch.ones(vocab_size, dtype=torch.bool)
        free[seen] = False
        seen = torch.cat([seen, torch.nonzero(free).flatten()[: size - seen.numel()]])
    return DraftVocab.from_used(seen, vocab_size)


def build_vocab(feature_dir, size: int) -> DraftVocab:
    return vocab_from_counts(count_train_tokens(feature_dir), size)


def _ids_in(b_to_a: torch.Tensor, a_vocab_size: int, held: torch.Tensor) -> torch.Tensor:
    """`b_to_a` inverted: each of a's target ids as b's, -1 where b's vocabulary has no such token. Where
    b has two tokens of its bytes (a byte-fallback <0x41> beside 'A'), the lowest of those b's draft
    vocab holds (`held`, its target ids), else the lowest."""
    valid = (b_to_a >= 0) & (b_to_a < a_vocab_size)
    none = b_to_a.numel()
    out = torch.full((a_vocab_size,), none, dtype=torch.int64)
    held = valid & torch.isin(torch.arange(none), held)
    for ids in (torch.nonzero(valid).flatten(), torch.nonzero(held).flatten()):
        pick = torch.full((a_vocab_size,), none, dtype=torch.int64)
        pick.scatter_reduce_(0, b_to_a[ids].long(), ids, "amin")
        out = torch.where(pick < none, pick, out)  # the second pass (held ids) overrides the first
    return torch.where(out == none, -1, out)


def compare_vocabs(a: DraftVocab, b: DraftVocab, top: int = 10, b_to_a: torch.Tensor | None = None) -> dict:
    """How far two draft vocabularies agree (the seeds' "252 of 32,000 positions" diagnosis).

    `same_positions`: draft positions i where both map to the same target token, i.e. where an
    lm_head row can be reused unchanged. `shared_tokens`: target tokens both hold (rows a remap
    could reuse). `largest_gaps`: positions whose target ids differ most. `only_a`/`only_b`: the
    lowest target ids held by one side only, each in its own target's ids.

    `b_to_a` (drafter.transfer.token_map): where the two targets' tokenizers differ, each of b's
    target ids as a's (-1: none); a's tokens are then compared as b's ids (`largest_gaps` shows them
    so), and one b's vocabulary lacks is held by a only, never at a same position. None: ids name the
    same tokens in both.
    """
    ua, ub = a.used, b.used
    as_b = ua if b_to_a is None else _ids_in(b_to_a, a.target_vocab_size, ub)[ua]
    n = min(a.size, b.size)
    gaps = torch.where(as_b[:n] >= 0, (as_b[:n] - ub[:n]).abs(), 0)  # one b's vocabulary lacks: no gap to measure
    order = torch.sort(gaps, descending=True, stable=True).indices
    order = order[gaps[order] > 0][:top]
    ta, tb = set(as_b[as_b >= 0].tolist()), set(ub.tolist())
    only_a = sorted(ua[~torch.isin(as_b, ub)].tolist())
    return {
        "size_a": a.size,
        "size_b": b.size,
        "target_vocab_a": a.target_vocab_size,
        "target_vocab_b": b.target_vocab_size,
        "same_positions": int((as_b[:n] == ub[:n]).sum()),  # -1 is no id of b
        "shared_tokens": len(ta & tb),
        "only_a_count": len(only_a),
        "only_b_count": len(tb - ta),
        "largest_gaps": [
            {"position": int(i), "target_a": int(as_b[i]), "target_b": int(ub[i]), "gap": int(gaps[i])}
            for i in order
        ],
        "only_a": only_a[:top],
        "only_b": sorted(tb - ta)[:top],
    }
