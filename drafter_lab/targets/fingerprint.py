"""A model directory's name by content: a fingerprint cheap to take on a 1 TB checkpoint that still
tells a fine-tune from its base.

It hashes config.json and, per weight file, its name and size; for a safetensors file also its whole
header (every tensor's name, dtype, shape and offsets) and a sample of every tensor's bytes (a small
tensor whole; else 1 KiB windows at its start, its end and spread between): a fine-tune or a merged
LoRA rewrites whole tensors, so it changes a window of each tensor it touches, wherever that tensor
lies in the file, and rows trained at either end of a matrix (tokens added to a vocabulary) are seen
too. A pickled `.bin` has no header to read, so its windows are spread over the file, one per MiB.
About 1.5k reads for an 8B model.

Labs before this one hashed only each file's leading and trailing MiB (`legacy_fingerprint`), which a
fine-tune of the middle layers keeps; what they recorded under that name still resumes, pairs and
trains (`Target.known_as`, `recorded_name`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from drafter_lab.errors import LabError

BIN_WEIGHTS = "pytorch_model*.bin"
"""The pickled weights transformers loads (pytorch_model.bin, its shards, a variant's); every other `.bin`
beside a model is none of its weights: the Trainer's training_args.bin, accelerate's optimizer.bin,
scheduler.bin and sampler.bin. A shard index's own names count too."""
MIB = 1 << 20
WINDOW = 1 << 10
"""Bytes hashed per window."""
WHOLE = 64 << 10
"""A span up to this long (a norm's weight, a bias) is hashed whole."""
TENSOR_STRIDE, TENSOR_WINDOWS = 16 * MIB, 64
"""A safetensors tensor: one window per TENSOR_STRIDE bytes, at least one and TENSOR_WINDOWS at most."""
MAX_HEADER = 100_000_000
"""The longest safetensors header read, as the safetensors library's own limit: a file that is none, whose
first 8 bytes happen to read as a length within its size, would else be read into memory whole."""
FILE_STRIDE, FILE_WINDOWS = MIB, 4096
"""A `.bin`: one window per FILE_STRIDE bytes of the file, FILE_WINDOWS at most (so every tensor larger
than the spacing is sampled, up to a 4 GiB file)."""


def weight_files(path: Path) -> list[Path]:
    """The weight files of a model directory: every `*.safetensors` and the `.bin` files that hold the model
    (BIN_WEIGHTS); a dangling link stays, to be reported when it is read."""
    bins = {f.name for f in path.glob(BIN_WEIGHTS)} | _indexed_bins(path)
    files = sorted([*path.glob("*.safetensors"), *(f for f in path.glob("*.bin") if f.name in bins)])
    return [f for f in files if not (f.name.startswith(".") or f.is_dir())]


def _indexed_bins(path: Path) -> set[str]:
    """The files a `*.bin.index.json` shard index names (an unreadable one names none: loading says why)."""
    names = set()
    for index in path.glob("*.bin.index.json"):
        try:
            weight_map = json.loads(index.read_bytes()).get("weight_map")
            names.update(f for f in weight_map.values() if isinstance(f, str))
        except (OSError, ValueError, AttributeError):
            continue
    return names


def _config(path: Path) -> bytes:
    try:
        return (path / "config.json").read_bytes()
    except FileNotFoundError:
        raise LabError("not a model directory: config.json is missing", path) from None
    except NotADirectoryError:  # a weights or config file given for its model (torchrun's capture reads this first)
        raise LabError("is a file, not a model directory: give the directory that holds the model", path) from None
    except OSError as e:  # config.json a directory, or unreadable
        raise LabError(f"cannot read config.json: {e.strerror}", path) from None


def _windows(begin: int, length: int, stride: int, most: int):
    """(offset, size) of the windows sampling `length` bytes from `begin`: all of them up to WHOLE;
    else the first and last WINDOW, so that a change to a matrix's first or last rows is seen (rows
    of tokens added at the end of a vocabulary), and one more per `stride` bytes (at least one, `most`
    at most), each centred in its equal part."""
    if length <= WHOLE:
        yield begin, length
        return
    yield begin, WINDOW
    n = max(1, min(most, length // stride))
    for i in range(n):
        yield begin + (length - WINDOW) * (2 * i + 1) // (2 * n), WINDOW
    yield begin + length - WINDOW, WINDOW


def _read(fh, at: int, size: int) -> bytes:
    fh.seek(at)
    return fh.read(size)


def _safetensors_sample(f: Path, fh, size: int, h) -> None:
    raw = fh.read(8)
    n = int.from_bytes(raw, "little") if len(raw) == 8 else -1
    if not 0 < n <= min(size - 8, MAX_HEADER):
        raise LabError("not a safetensors file: bad header length", f)
    header = fh.read(n)
    h.update(header)
    try:
        entries = json.loads(header)
        spans = sorted((name, *e["data_offsets"]) for name, e in entries.items() if name != "__metadata__")
        if not all(len(s) == 3 and all(type(x) is int for x in s[1:]) for s in spans):
            raise ValueError("data_offsets is not a pair of integers")
    except (ValueError, TypeError, KeyError, AttributeError):
        raise LabError("not a safetensors file: unreadable header", f) from None
    for name, begin, end in spans:
        if not 0 <= begin <= end <= size - 8 - n:
            raise LabError(f"safetensors header: tensor {name} lies outside the file", f)
        for at, length in _windows(8 + n + begin, end - begin, TENSOR_STRIDE, TENSOR_WINDOWS):
            h.update(_read(fh, at, length))


def _file_sample(fh, size: int, h) -> None:
    """Windows spread over the whole file (a pickle has no index to read)."""
    for at, length in _windows(0, size, FILE_STRIDE, FILE_WINDOWS):
        h.update(_read(fh, at, length))


def _digest(path, sample) -> str:
    """sha256 over config.json and, per weight file, its name, size and what `sample` hashes of it."""
    path = Path(path)
    h = hashlib.sha256(_config(path))
    for f in weight_files(path):
        try:
            size = f.stat().st_size
            h.update(f"{f.name}:{size}".encode())
            with open(f, "rb") as fh:
                sample(f, fh, size, h)
        except OSError as e:  # a dangling link (an interrupted download), a file that cannot be read
            raise LabError(f"cannot read the weights: {e.strerror}", f) from None
    return h.hexdigest()[:16]


def _sample(f: Path, fh, size: int, h) -> None:
    if f.suffix == ".safetensors":
        _safetensors_sample(f, fh, size, h)
    else:
        _file_sample(fh, size, h)


def _head_and_tail(f: Path, fh, size: int, h) -> None:
    h.update(_read(fh, 0, MIB))
    if size > MIB:  # the last MiB; between 1 and 2 MiB, the rest of the file
        h.update(_read(fh, max(MIB, size - MIB), MIB))


def fingerprint(path) -> str:
    return _digest(path, _sample)


def legacy_fingerprint(path) -> str:
    """The name labs before this module recorded: config.json and each weight file's name, size and
    leading/trailing MiB."""
    return _digest(path, _head_and_tail)


def recorded_name(path, recorded: str | None) -> str:
    """The name to record `path` by beside work that recorded `recorded`: that, where it is this
    model's legacy name (so the work resumes under one name), else its fingerprint."""
    return recorded if recorded is not None and recorded == legacy_fingerprint(path) else fingerprint(path)
