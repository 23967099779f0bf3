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


def save_safetensors(tensors: dict, path, metadata: dict | None = None) -> None:
    """Same tensors and metadata, same bytes: safetensors writes the metadata map in hash order,
    which differs from process to process, so the header is re-written in place with sorted keys
    (the same keys and values, so the same length)."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
        with open(tmp, "r+b") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.dumps(json.loads(f.read(n)), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            if len(header.encode()) <= n:  # serde and json escape alike; never write past the header
                f.seek(8)
                f.write(header.encode().ljust(n))


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
