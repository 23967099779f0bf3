"""Import SpecForge's offline hidden states as a feature directory, without running the target.

SpecForge's `prepare_hidden_states` writes one `torch.save` dict per sequence (`*.ckpt`, or gzipped
as `*.ckpt.gz` with its --compress, read here too, from memory rather than mapped):

    input_ids         [T] (or [1, T])    token ids
    loss_mask         [T] (or [1, T])    1 on assistant tokens
    hidden_state      [1, T, H]          the target's last hidden state, after the final norm
    aux_hidden_state  [1, T, 3H]         three layers' outputs, concatenated

Its batched writer saves each row as its collator padded it: right-padded to the batch's longest
with zeros (input_ids 0, loss_mask 0), the states run over the padding too, and no attention_mask.
That trailing run is dropped here, rows and states alike (an attention_mask, where a file has one,
decides instead), so the shards hold the real tokens only.

Its aux layer ids count "output of layer k" (default [1, L//2-1, L-4]); ours are HF
`output_hidden_states` indices, one more (DESIGN section 3), so the conversion happens here and the
manifest records ours. Only the target's config, embedding and lm_head are read (for the
fingerprint and the shape checks), so a target of any size imports in seconds per shard. The
split, the shard plan and resume are capture's: a killed import picks up where it stopped.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import zlib
from pathlib import Path

import torch

from drafter_lab.data.capture import (
    DTYPES,
    CaptureConfig,
    check_config,
    check_out_dir,
    check_resumable,
    plan_shards,
    resume_settings,
    write_planned,
)
from drafter_lab.data.shards import MANIFEST, Manifest, Sequence
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import (
    check_aux_layer_ids,
    default_aux_layer_ids,
    first_line,
    load_target_head,
    whole_ids,
)

FORMAT = "specforge-offline"
KEYS = ("input_ids", "loss_mask", "hidden_state", "aux_hidden_state")
INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
TAIL = 4096


def _listing_hash(root: Path, files: list[Path]) -> str:
    """Names, sizes and last 4 KiB of every file: cheap on terabytes, and any added, removed or
    rewritten sequence changes it, so a resume over rewritten files is refused, not mixed with them."""
    # The tail, not the mtime: torch.save's zip ends with its directory, which holds each tensor's
    # CRC-32, so other values of the same shape change it, while a copy of the files still resumes.
    h = hashlib.sha256()
    for f in files:
        try:
            size = f.stat().st_size
            with open(f, "rb") as fh:
                fh.seek(max(0, size - TAIL))
                h.update(f"{f.relative_to(root)}:{size}:".encode() + fh.read() + b"\n")
        except OSError as e:  # a dangling link, a file we may not read
            raise LabError(f"cannot read ({e.strerror or first_line(e)})", f) from None
    return h.hexdigest()


def _flat(t: torch.Tensor, where: Path, name: str) -> torch.Tensor:
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1:
        raise LabError(f"{name} has shape {tuple(t.shape)}, want [T] or [1, T]", where)
    return t


def _load(path: Path) -> dict:
    # Memory-mapped: the states stay file pages that the shard writer copies out, not process memory.
    try:
        if path.name.endswith(".gz"):
            d = torch.load(io.BytesIO(gzip.decompress(path.read_bytes())), map_location="cpu", weights_only=True)
        else:
            d = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:  # truncated or not gzip at all
        raise LabError(f"cannot read as a gzipped SpecForge sample ({first_line(e)})", path) from None
    except Exception as e:
        raise LabError(f"cannot read as a SpecForge sample ({first_line(e)})", path) from None
    if not isinstance(d, dict):
        raise LabError(f"holds {type(d).__name__}, not a SpecForge sample (a dict of tensors)", path)
    missing = sorted(set(KEYS) - set(d))
    if missing:
        raise LabError(f"SpecForge sample lacks {missing}", path)
    others = [k for k in KEYS if not isinstance(d[k], torch.Tensor)]
    if others:
        raise LabError(f"SpecForge sample's {others} are not tensors", path)
    return d


def _real_length(d: dict, path: Path) -> int:
    """The token count before the padding (see the module docstring)."""
    ids, mask = _flat(d["input_ids"], path, "input_ids"), _flat(d["loss_mask"], path, "loss_mask")
    if "attention_mask" in d:
        att = d["attention_mask"]
        if not isinstance(att, torch.Tensor):
            raise LabError("SpecForge sample's attention_mask is not a tensor", path)
        att = _flat(att, path, "attention_mask") != 0
        n = int(att.sum())
        if len(att) != len(ids) or not torch.equal(att, torch.arange(len(att)) < n):
            raise LabError(f"attention_mask {tuple(att.shape)} is not ones then zeros over input_ids "
                           f"{tuple(ids.shape)}", path)
        return n
    if len(mask) != len(ids):
        return len(ids)  # read_sample names the mismatch
    real = ((ids != 0) | (mask != 0)).nonzero()
    return int(real[-1]) + 1 if len(real) else 0


def _seq_id(relative: Path) -> str:
    """A sample's name without .ckpt or .ckpt.gz: gzipping it keeps its id, and so its split."""
    return str(relative).removesuffix(".gz").removesuffix(".ckpt")


def sample_length(path: Path) -> int:
    """A sample's token count, padding left out, from its header, ids and masks alone."""
    return _real_length(_load(path), path)


def read_sample(path: Path, seq_id: str, hidden: int, vocab: int, dtype: torch.dtype | None = None) -> Sequence:
    """One SpecForge sample as a Sequence; any missing key, shape, token id, mask value or dtype
    (`dtype`, the first sample's; None: any) that does not fit names the file."""
    d = _load(path)
    ids, mask = _flat(d["input_ids"], path, "input_ids"), _flat(d["loss_mask"], path, "loss_mask")
    final, aux = d["hidden_state"].squeeze(0), d["aux_hidden_state"].squeeze(0)
    n = len(ids)
    if len(mask) != n or tuple(final.shape) != (n, hidden) or tuple(aux.shape) != (n, 3 * hidden):
        raise LabError(
            f"shapes do not fit the target (hidden {hidden}): input_ids {tuple(ids.shape)}, loss_mask "
            f"{tuple(mask.shape)}, hidden_state {tuple(final.shape)}, aux_hidden_state {tuple(aux.shape)}",
            path,
        )
    n = _real_length(d, path)
    ids, mask, final, aux = ids[:n], mask[:n], final[:n], aux[:n]
    if ids.dtype not in INT_DTYPES:
        raise LabError(f"input_ids are {ids.dtype}, not integers", path)
    if n and not (0 <= int(ids.min()) and int(ids.max()) < vocab):  # before .long() and the shard's int32
        raise LabError(f"input_ids run {int(ids.min())}..{int(ids.max())}, outside the target's vocabulary "
                       f"0..{vocab - 1}", path)
    if ((mask != 0) & (mask != 1)).any():
        raise LabError("loss_mask holds values other than 0 and 1", path)
    # The shards hold one dtype: another sample's would be cast to it silently.
    if final.dtype != aux.dtype:
        raise LabError(f"hidden_state is {final.dtype} but aux_hidden_state {aux.dtype}", path)
    if dtype is not None and final.dtype != dtype:
        raise LabError(f"hidden states are {final.dtype}, but the first sample's are {dtype}", path)
    if not (torch.isfinite(final).all() and torch.isfinite(aux).all()):
        raise LabError("NaN or inf in the hidden states", path)
    return Sequence(seq_id=seq_id, input_ids=ids.long(), loss_mask=mask.bool(), aux_hidden=aux, final_hidden=final)


def check_settings(val_fraction: float, shard_size: int) -> None:
    """The split and shard size, refused as `data prepare` refuses them (in words that name the fields, which
    `data import-specforge` names as its flags), before a file is read."""
    check_config(CaptureConfig(val_fraction=val_fraction, shard_size=shard_size))


def import_specforge(src_dir, target_dir, out_dir, *, aux_layer_ids: list[int] | None = None,
                     val_fraction: float = 0.1, shard_size: int = 256) -> Manifest:
    """Convert every `*.ckpt` (or `*.ckpt.gz`) under `src_dir` (made from `target_dir`) into shards under `out_dir`.

    `aux_layer_ids` are SpecForge's ("output of layer k", as in its draft config's
    `eagle_aux_hidden_state_layer_ids`); None means its default for the target's depth."""
    check_settings(val_fraction, shard_size)
    src, out = Path(src_dir), Path(out_dir)
    if src.is_file():  # one sample given for its directory: "not found" would send the user looking for it
        raise LabError("is a file, not a directory: give the directory SpecForge's prepare_hidden_states wrote", src)
    if not src.is_dir():
        raise LabError("SpecForge hidden-states directory not found", src)
    # As SpecForge's loader: files only (a directory named *.ckpt is not a sample), and its --compress
    # output, *.ckpt.gz, beside them (a run resumed with --compress leaves some of each).
    files = sorted(p for p in src.rglob("*.ckpt*") if p.name.endswith((".ckpt", ".ckpt.gz")) and not p.is_dir())
    if not files:
        raise LabError("no *.ckpt files (SpecForge offline hidden states) below it", src)
    check_out_dir(out)
    target = load_target_head(target_dir)
    ours = default_aux_layer_ids(target.num_layers)
    if aux_layer_ids is not None:
        # Refused in SpecForge's ids, as typed, not in the hidden_states indices they become (a user who
        # typed 3,1,4 was told [4, 2, 5] were out of order). The shift keeps order and repeats: the one
        # refusal left to check_aux_layer_ids, a repeat, names positions, not ids.
        typed = whole_ids(aux_layer_ids, "SpecForge's: the output of layer i", target.path)
        if len(typed) != 3:
            raise LabError(f"need exactly 3 aux layer ids, got {typed}", target.path)
        if not all(0 <= i < target.num_layers - 1 for i in typed):
            raise LabError(f"aux layer ids {typed} out of range: SpecForge's (the output of layer i) run "
                           f"0..{target.num_layers - 2} for a target of {target.num_layers} layers", target.path)
        if typed != sorted(typed) and [i + 1 for i in typed] != ours:
            raise LabError(f"aux layer ids {typed} are not in layer order: SGLang and vLLM hand the drafter's fc the "
                           f"states in layer order ({sorted(typed)}), so give them ascending", target.path)
        ours = check_aux_layer_ids([i + 1 for i in typed], target.num_layers, target.path)
    first = read_sample(files[0], "probe", target.hidden_size, target.vocab_size)
    dtype = next((name for name, dt in DTYPES.items() if dt == first.aux_hidden.dtype), None)
    if dtype is None:
        raise LabError(f"hidden states are {first.aux_hidden.dtype}; expected one of {', '.join(DTYPES)}", files[0])

    source = {"format": FORMAT, "dir": str(src), "files": len(files), "listing_sha256": _listing_hash(src, files),
              "val_fraction": val_fraction, "shard_size": shard_size}
    describe = target.describe()
    existing = Manifest.load(out) if (out / MANIFEST).exists() else None
    if existing is not None:
        check_resumable(out, existing, resume_settings(describe, ours, dtype, source))
    items = [(_seq_id(f.relative_to(src)), f) for f in files]
    seen: dict[str, Path] = {}
    for seq_id, f in items:
        if (other := seen.setdefault(seq_id, f)) is not f:
            raise LabError(f"{other.relative_to(src)} and {f.relative_to(src)} are one sample, gzipped and not: "
                           "keep one", src)

    def convert(chunk, advance, put):
        for j, (seq_id, path) in enumerate(chunk):
            put(j, read_sample(path, seq_id, target.hidden_size, target.vocab_size, first.aux_hidden.dtype))
            advance(1)

    manifest = Manifest(target=describe, aux_layer_ids=ours, dtype=dtype, source=source)
    return write_planned(out, manifest, existing, plan_shards(items, val_fraction, shard_size), DTYPES[dtype],
                         lambda item: sample_length(item[1]), convert, what="import")
