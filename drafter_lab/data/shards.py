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
skipping what the manifest already lists (`data prepare` first reads back each one's tokens and loss
masks: `stored_text`). Shards are written a sequence at a time, in any order,
into a layout fixed by the planned lengths (`ShardWriter`), and read a sequence at a time
(`ShardReader`, through safetensors' memory map): neither side holds a shard in memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from drafter_lab import atomic
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import first_line

FORMAT = "drafter_lab.features/1"
MANIFEST = "manifest.json"
AUX_CONVENTION = "hf_hidden_states"  # index 0 = embeddings, index i = output of layer i-1
SPLITS = ("train", "val")
HIDDEN_KEYS = ("aux_hidden", "final_hidden")
SEQUENCE_KEYS = ("input_ids", "loss_mask", *HIDDEN_KEYS)
KEYS = (*SEQUENCE_KEYS, "offsets")


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
        if not isinstance(data, dict):
            raise LabError("not a JSON object", path)
        if data.get("format") != FORMAT:
            raise LabError(f"unknown feature format {data.get('format')!r} (want {FORMAT})", path)
        data.pop("counts", None)
        if unknown := sorted(data.keys() - {f.name for f in fields(cls)}):
            raise LabError(f"unknown field {unknown[0]!r} (written by a newer drafter_lab?)", path)
        _check_shape(data, path)
        return cls(**data)


_FIELD_TYPES = {"target": (dict, "an object"), "aux_layer_ids": (list, "a list"), "dtype": (str, "a string"),
                "source": (dict, "an object"), "shards": (dict, "an object"), "skipped": (dict, "an object")}
_ROW_COUNTS = ("sequences", "tokens", "loss_tokens")


def _check_shape(data: dict, path: Path) -> None:
    """A manifest's fields of the types the lab reads them as: an edited or foreign one is refused
    here in one line, not met as a TypeError wherever a field is first used."""
    if missing := [k for k in ("target", "aux_layer_ids", "dtype") if k not in data]:
        raise LabError(f"no {missing[0]!r} field", path)
    for name, (kind, what) in _FIELD_TYPES.items():
        if name in data and not isinstance(data[name], kind):
            raise LabError(f"{name!r} is not {what}", path)
    if not (isinstance(data["target"].get("fingerprint"), str) and type(data["target"].get("hidden_size")) is int):
        raise LabError("'target' lacks its fingerprint or hidden_size", path)
    if not all(type(i) is int for i in data["aux_layer_ids"]):
        raise LabError("'aux_layer_ids' holds a non-integer", path)
    for split, rows in data.get("shards", {}).items():
        if not (isinstance(rows, list) and all(isinstance(r, dict) for r in rows)):
            raise LabError(f"shards of {split!r} are not a list of objects", path)
        for r in rows:
            if not isinstance(r.get("file"), str) or not all(type(r.get(k)) is int for k in _ROW_COUNTS):
                raise LabError(f"a {split!r} shard row lacks a string 'file' or integer {', '.join(_ROW_COUNTS)}",
                               path)


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.safetensors"


def is_shard_name(name: str) -> bool:
    """`name` is one shard_name gives."""
    split, _, rest = name.partition("-")
    index = rest.removesuffix(".safetensors")
    return split in SPLITS and index != rest and len(index) >= 5 and index.isdigit()


class ShardWriter:
    """One shard, written a sequence at a time as each is captured, in any order: its layout follows
    from the sequence ids and lengths given up front, so memory holds one sequence, not a shard.
    Use it as a context manager; on a clean exit with every sequence put, the shard lands
    atomically and `row` is its manifest row."""

    def __init__(self, directory, split: str, index: int, seq_ids: list[str], lengths: list[int],
                 hidden_size: int, dtype: torch.dtype):
        if not seq_ids:
            raise ValueError("empty shard")
        self.name = shard_name(split, index)
        self.path = Path(directory) / self.name
        self.offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        self.offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
        tokens = int(self.offsets[-1])
        layout = {
            "input_ids": (torch.int32, [tokens]),
            "loss_mask": (torch.uint8, [tokens]),
            "aux_hidden": (dtype, [tokens, 3 * hidden_size]),
            "final_hidden": (dtype, [tokens, hidden_size]),
            "offsets": (torch.int64, [len(lengths) + 1]),
        }
        self._file = atomic.SafetensorsWriter(self.path, layout, metadata={"seq_ids": json.dumps(seq_ids)})
        self._seq_ids, self._put, self._loss_tokens = seq_ids, set(), 0
        self.row: dict | None = None

    def __enter__(self) -> ShardWriter:
        self._file.__enter__()
        self._file.write("offsets", 0, self.offsets)
        return self

    def put(self, j: int, seq: Sequence) -> None:
        """Write sequence `j` of the shard (it must have the length it was planned with)."""
        a, b = int(self.offsets[j]), int(self.offsets[j + 1])
        if seq.seq_id != self._seq_ids[j] or len(seq.input_ids) != b - a or j in self._put:
            raise ValueError(f"sequence {seq.seq_id} ({len(seq.input_ids)} tokens) is not slot {j} of {self.name}")
        for key in SEQUENCE_KEYS:
            self._file.write(key, a, getattr(seq, key))
        self._put.add(j)
        self._loss_tokens += int(seq.loss_mask.sum())

    def __exit__(self, *exc) -> None:
        self._file.__exit__(*exc)
        if exc[0] is None:
            self.row = {
                "file": self.name,
                "sequences": len(self._seq_ids),
                "tokens": int(self.offsets[-1]),
                "loss_tokens": self._loss_tokens,
                "sha256": atomic.sha256_file(self.path),
            }


@dataclass(frozen=True)
class SequenceRef:
    """Where one captured sequence lies: a shard and its token range there."""

    shard: Path
    start: int
    end: int
    seq_id: str

    def __len__(self) -> int:
        return self.end - self.start


def _corrupt(e: Exception, path: Path) -> LabError:
    if isinstance(e, FileNotFoundError):
        return LabError("feature shard is missing", path)
    return LabError(f"truncated or corrupt feature shard ({first_line(e)})", path)


def _open(path: Path):
    from safetensors import safe_open

    try:
        return safe_open(str(path), framework="pt")
    except Exception as e:
        raise _corrupt(e, path) from None


def stored_text(path: Path) -> tuple[list[str], torch.Tensor, torch.Tensor, torch.Tensor]:
    """A shard's sequence ids, input_ids, loss_mask and offsets: all it holds but the hidden states."""
    f = _open(path)
    try:
        seq_ids = json.loads((f.metadata() or {}).get("seq_ids", "[]"))
        return seq_ids, *(f.get_tensor(k) for k in ("input_ids", "loss_mask", "offsets"))
    except Exception as e:
        raise _corrupt(e, path) from None


def check_token_ids(ids: torch.Tensor, vocab_size: int, path: Path, of: str = "") -> None:
    """`ids` all of a `vocab_size`-token vocab (one pass for their min and max): one that is not is a
    LabError naming `path`, not an IndexError (or a device assert) in an embedding."""
    if ids.numel():
        lo, hi = (int(v) for v in torch.aminmax(ids))
        if lo < 0 or hi >= vocab_size:
            raise LabError(f"token id {lo if lo < 0 else hi}{of} outside the target vocab ({vocab_size})", path)


class ShardReader:
    """Token ranges of shards read through safetensors' memory map: a sequence costs its own bytes,
    not its shard's. The last `max_open` shards stay open."""

    def __init__(self, max_open: int = 16):
        self.max_open = max_open
        self._open: dict[Path, object] = {}

    def handle(self, path: Path):
        f = self._open.pop(path, None) or _open(path)
        if len(self._open) >= self.max_open:
            self._open.pop(next(iter(self._open)))
        self._open[path] = f  # most recently used last
        return f

    def rows(self, path: Path, key: str, a: int, b: int, f=None) -> torch.Tensor:
        try:
            return (f or self.handle(path)).get_slice(key)[a:b]
        except LabError:
            raise
        except Exception as e:
            raise _corrupt(e, path) from None

    def read(self, ref: SequenceRef, max_length: int | None = None, vocab_size: int | None = None) -> Sequence:
        """One sequence, its first `max_length` tokens; NaN/inf hidden states, or with `vocab_size` a token
        id outside it, are a LabError naming the shard."""
        end = ref.end if max_length is None else min(ref.end, ref.start + max_length)
        t = {k: self.rows(ref.shard, k, ref.start, end) for k in SEQUENCE_KEYS}
        for key in HIDDEN_KEYS:
            if not torch.isfinite(t[key]).all():
                raise LabError(f"NaN or inf in {key} of sequence {ref.seq_id}: refusing to train on it", ref.shard)
        if vocab_size is not None:  # a pass over [T] ids, beside the one over [T, 4H] states above
            check_token_ids(t["input_ids"], vocab_size, ref.shard, f" of sequence {ref.seq_id}")
        return Sequence(ref.seq_id, t["input_ids"].long(), t["loss_mask"].bool(), t["aux_hidden"], t["final_hidden"])

    def index(self, path: Path, hidden_size: int) -> list[SequenceRef]:
        """The sequences of one shard, from its offsets and header only; a shard whose tensors are
        missing, of another width than the manifest says, or not spanned by its offsets is a
        LabError naming it."""
        f = self.handle(path)
        try:
            keys = set(f.keys())
            if missing := sorted(set(KEYS) - keys):
                raise LabError(f"feature shard lacks {missing}", path)
            shapes = {k: f.get_slice(k).get_shape() for k in KEYS}
            offsets = f.get_tensor("offsets").tolist()
            seq_ids = json.loads((f.metadata() or {}).get("seq_ids", "[]"))
        except LabError:
            raise
        except Exception as e:
            raise _corrupt(e, path) from None
        if len(shapes["offsets"]) != 1 or not offsets or offsets[0] != 0 or any(a > b for a, b in zip(offsets, offsets[1:])):
            raise LabError("corrupt feature shard: its offsets do not run up from 0", path)
        if not isinstance(seq_ids, list):
            raise LabError("corrupt feature shard: its seq_ids are not a list", path)
        tokens = offsets[-1]
        want = {"input_ids": [tokens], "loss_mask": [tokens], "aux_hidden": [tokens, 3 * hidden_size],
                "final_hidden": [tokens, hidden_size]}
        for k, shape in want.items():
            if list(shapes[k]) != shape:
                raise LabError(f"{k} is {list(shapes[k])}; its offsets and the manifest's hidden size say {shape}", path)
        return [SequenceRef(path, a, b, seq_ids[i] if i < len(seq_ids) else str(i))
                for i, (a, b) in enumerate(zip(offsets, offsets[1:]))]

    def scan(self, path: Path, vocab_size: int | None = None, chunk_bytes: int = 1 << 28) -> None:
        """Every hidden state of one shard checked finite, `chunk_bytes` at a time, and with
        `vocab_size` every token id checked to lie in it, through a handle of its own: the shard is
        unmapped when the scan is done."""
        f = _open(path)
        if vocab_size is not None:
            try:
                tokens = f.get_slice("input_ids").get_shape()[0]
            except Exception as e:
                raise _corrupt(e, path) from None
            check_token_ids(self.rows(path, "input_ids", 0, tokens, f), vocab_size, path)
        for key in HIDDEN_KEYS:
            try:
                tokens, width = f.get_slice(key).get_shape()
            except Exception as e:  # no such tensor, or not rows of states
                raise _corrupt(e, path) from None
            # rows are read as stored: a bf16 shard's row is half a float32 one's
            step = max(1, chunk_bytes // (self.rows(path, key, 0, 1, f).element_size() * width))
            for a in range(0, tokens, step):
                if not torch.isfinite(self.rows(path, key, a, a + step, f)).all():
                    raise LabError(f"NaN or inf in {key}: refusing to train on it", path)


class FeatureSet:
    """A feature directory opened for reading."""

    def __init__(self, directory):
        self.dir = Path(directory)
        if self.dir.is_file():
            raise LabError("is a file, not a feature directory", self.dir)
        if not self.dir.is_dir():
            raise LabError("feature directory not found", self.dir)
        self.manifest = Manifest.load(self.dir)
        self.reader = ShardReader()

    @property
    def hidden_size(self) -> int:
        return int(self.manifest.target["hidden_size"])

    @property
    def vocab_size(self) -> int | None:
        """The target vocab size the manifest records (`Target.describe()`'s); None where it records no
        integer (the shape check lets it be absent), for each caller to skip or refuse."""
        vocab = self.manifest.target.get("vocab_size")
        return vocab if type(vocab) is int else None  # true is an int to Python, not a size

    @property
    def fingerprint(self) -> str:
        return self.manifest.target["fingerprint"]

    def check_target(self, target) -> None:
        """Features made by another target than `target` (a Target or TargetHead) are refused."""
        if not target.known_as(self.fingerprint):
            raise LabError(
                f"features were captured from target {self.fingerprint} "
                f"({self.manifest.target.get('path')}), not from {target.path} ({target.fingerprint})",
                self.dir,
            )

    def shards(self, split: str) -> list[dict]:
        """The manifest rows of `split`'s shards, refused until the capture has written all it planned."""
        rows = self.manifest.shards.get(split, [])
        planned = self.manifest.source.get("planned", {}).get(split, {}).get("shards", 0)
        if len(rows) < planned:  # a killed `data prepare`: using part of it would be silently different
            raise LabError(
                f"partial capture: {split} has {len(rows)} of {planned} shards; run the same "
                "`drafter-lab data prepare` again to finish it",
                self.dir,
            )
        return rows

    def index(self, split: str) -> list[SequenceRef]:
        """Every sequence of `split`, located but not read (shard headers and offsets only)."""
        refs = []
        for row in self.shards(split):
            path = self.dir / row["file"]
            got = self.reader.index(path, self.hidden_size)
            tokens = got[-1].end if got else 0
            if (len(got), tokens) != (row["sequences"], row["tokens"]):  # a shard of another capture, say
                raise LabError(f"holds {len(got)} sequences of {tokens} tokens; the manifest lists {row['sequences']} "
                               f"of {row['tokens']}", path)
            refs += got
        return refs

    def require(self, split: str) -> list[SequenceRef]:
        """`index(split)`, refused when the manifest counts no loss token in it."""
        refs = self.index(split)
        if not refs or not self.manifest.counts(split)["loss_tokens"]:
            what = ("nothing to validate on: capture some (`data prepare --val-fraction`), or pass --val-data"
                    if split == "val" else "nothing to train on")
            raise LabError(f"no {split} sequences with loss tokens, {what}", self.dir)
        return refs

    def read(self, refs: list[SequenceRef]) -> list[Sequence]:
        """The sequences `refs` locate, their token ids checked against the capturing target's vocab (the
        probe embeds them: else an IndexError in the drafter's embedding); unchecked where it records none."""
        return [self.reader.read(r, vocab_size=self.vocab_size) for r in refs]

    def sequences(self, split: str) -> list[Sequence]:
        """All of `split` in memory: for small sets and tests; training reads per batch."""
        return self.read(self.index(split))
