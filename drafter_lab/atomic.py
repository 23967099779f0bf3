"""Atomic writes (temp file in the same directory + fsync + rename), the matching JSON read, and
content hashes.

A killed run never leaves a half-written file: readers see the old version or the new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from drafter_lab.errors import LabError

_UMASK = os.umask(0o22)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temp path beside `path`; on success it is fsynced and renamed over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            # mkstemp makes 0600, and some writers (safetensors) replace the file with their own
            # 0600 one: the result should look like any new file.
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def write_json(path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_json(path, missing: str, owner=None):
    """The JSON value in `path`. A missing file is LabError(`missing`) naming `owner` (the directory
    the file belongs to; default the file); a file that does not parse is one naming the file."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise LabError(missing, owner if owner is not None else path) from None
    except json.JSONDecodeError as e:
        raise LabError(f"{path.name} is not valid JSON ({e})", path.parent) from None


_SAFETENSORS_DTYPES = {
    "torch.float64": "F64", "torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16",
    "torch.int64": "I64", "torch.int32": "I32", "torch.int16": "I16", "torch.int8": "I8",
    "torch.uint8": "U8", "torch.bool": "BOOL",
}


def save_safetensors(tensors: dict, path, metadata: dict | None = None, dtypes: dict | None = None) -> None:
    """Write a safetensors file atomically. A value may be a list of tensors, stored as their
    concatenation along dim 0, and `dtypes` may name a stored dtype per key: each piece is converted
    and written in turn, so no concatenated copy and no whole-file buffer is made (a capture shard of
    a wide target is tens of GB). Keys are written sorted, so the same content gives the same bytes
    (safetensors' own writer orders the metadata by hash, which changes from process to process)."""
    import torch

    dtypes = dtypes or {}
    pieces = {k: [t.detach() for t in (v if isinstance(v, (list, tuple)) else [v])] for k, v in tensors.items()}
    dtype = {k: dtypes.get(k, ps[0].dtype) for k, ps in pieces.items()}
    # Wider elements first, as safetensors does: every tensor then starts at a multiple of its size.
    order = sorted(pieces, key=lambda k: (-dtype[k].itemsize, k))
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for k in order:
        ps = pieces[k]
        shape = list(ps[0].shape) if len(ps) == 1 else [sum(p.shape[0] for p in ps), *ps[0].shape[1:]]
        if any(p.shape[1:] != ps[0].shape[1:] for p in ps):
            raise ValueError(f"{k}: pieces differ beyond dim 0")
        n = dtype[k].itemsize * (torch.Size(shape).numel())
        header[k] = {"dtype": _SAFETENSORS_DTYPES[str(dtype[k])], "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for k in order:
            for p in pieces[k]:
                f.write(p.to(device="cpu", dtype=dtype[k]).contiguous().reshape(-1).view(torch.uint8).numpy())


def torch_save(obj, path) -> None:
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike):
    """Yield a temp directory beside `path`; on success it replaces `path` whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    tmp.chmod(0o777 & ~_UMASK)  # mkdtemp makes 0700
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sha256_file(path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
