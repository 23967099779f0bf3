"""Atomic writes (temp file in the same directory + fsync + rename), the matching JSON read, and
content hashes.

A killed run never leaves a half-written file: readers see the old version or the new one. Its
temp (a shard, a whole target directory) would stay behind, so each temp is named for its writer,
`.<name>.<pid>@<host>.<random>.tmp`, and the next write of the same path on that host removes the
temps of writers that are gone. A live writer's temp, another host's (a shared cache) and a name
of another form are left alone.

A path that is a symbolic link is written where the link leads (the temp beside the target, renamed
there), as editors and `sed -i --follow-symlinks` do: the link stays, and its target gets the new
content. Renamed over, the link would be replaced by a file, and its target keep the old content.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import errno
import hashlib
import json
import math
import os
import re
import shutil
import socket
import stat
import tempfile
from pathlib import Path

from drafter_lab.errors import LabError

_UMASK = os.umask(0o22)
os.umask(_UMASK)
_WRITING: set[str] = set()  # names of the temps this process is writing


def _owner_prefix(path: Path) -> str:
    return f".{path.name}.{os.getpid()}@{socket.gethostname()}."


def _done(tmp: Path) -> None:
    _WRITING.discard(tmp.name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _gone(pid: int, name: str) -> bool:
    """Whether the writer of temp `name` (named for `pid`) has ended. A temp named for this process that
    it is not writing was left by an earlier process with its pid (a restarted container's: pids start
    over there), which `_alive` would take for this one."""
    return name not in _WRITING if pid == os.getpid() else not _alive(pid)


def clear_stale_temps(path: Path) -> None:
    """Remove the temps that writers of `path` on this host left when they were killed."""
    own = re.compile(rf"{re.escape(f'.{path.name}.')}(\d+)@{re.escape(socket.gethostname())}\.[^.]+\.tmp")
    with contextlib.suppress(FileNotFoundError):
        for entry in path.parent.iterdir():
            m = own.fullmatch(entry.name)
            if m and _gone(int(m.group(1)), entry.name):
                _remove(entry)


def _remove(path: Path) -> None:
    """Delete a temp, a directory or a file (the old version of a file that `atomic_dir` replaced)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def refuse_below_file(out: Path, flag: str = "--out") -> Path:
    """Refuse an output path whose nearest existing parent is a file now, before the work (`make_parent`
    refuses it only when the result is written); that parent otherwise."""
    parent = next(p for p in Path(out).absolute().parents if p.exists())
    if not parent.is_dir():
        raise LabError(f"{flag} lies below a file, not a directory", out)
    return parent


def make_parent(path: Path) -> None:
    """Create `path`'s directory; a path below a file is a one-line error naming it, not mkdir's traceback."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise LabError("lies below a file, not a directory", path) from None
    except OSError as e:  # no permission, a read-only or virtual file system (/proc)
        raise LabError(f"cannot create its directory: {e.strerror}", path) from None


def refuse_unwritable(path, flag: str) -> None:
    """Refuse, before the work, an output file that could not be written after it: a directory, a
    path below a file, or one whose nearest existing directory takes no new file. That is tried with
    a temp file there, as the write will do: access(2) passes root on read-only /proc and /sys."""
    path = Path(path)
    dest = _through_link(path)
    if dest.is_dir():
        raise LabError(f"is a directory: {flag} takes a file to write", path)
    if _special(dest):  # written through (`_commit`), not replaced: the node itself must take writes
        if not os.access(dest, os.W_OK):
            raise LabError(f"{flag}: this device or pipe takes no writes from this user", path)
        return
    _refuse_mount_point(dest, path)
    parent = refuse_below_file(dest, flag)
    try:
        tempfile.TemporaryFile(dir=parent).close()
    except OSError as e:
        raise LabError(f"{flag}: cannot write a file in {parent}: {e.strerror}", path) from None


def same_file(a, b) -> bool:
    """Whether paths `a` and `b` lead to one file: the same path once links are followed, or (both
    existing) one inode, a hard link's."""
    if os.path.realpath(a) == os.path.realpath(b):  # realpath, unlike resolve, takes a link loop as it is
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def refuse_outputs(outputs, inputs=()) -> None:
    """Refuse, before the work, an output file `refuse_unwritable` refuses, and one that names another
    output or an input: written last, it would replace the input the run read (a prompt set, a measured
    sweep) or the other output. A file the lab reads inside an input directory (a run's best.json, a
    drafter's config.json, a target's tokenizer) is refused too; any other file there (an earlier eval's
    JSON, written again) is not. Each is a (flag, path) pair; a path of None is a flag not given."""
    outputs = [(flag, path) for flag, path in outputs if path]
    inputs = [(flag, path) for flag, path in inputs if path]
    for flag, path in outputs:
        refuse_unwritable(path, flag)
    named = outputs + inputs
    for i, (flag, path) in enumerate(outputs):
        for other, other_path in named[i + 1:]:
            if same_file(path, other_path):
                raise LabError(f"{flag} and {other} name the same file", path)
        dest = os.path.realpath(path)  # where the write lands, through links
        for other, other_path in inputs:
            if (os.path.isfile(dest) and os.path.isdir(other_path) and _read_in_dirs(Path(dest))
                    and Path(dest).is_relative_to(os.path.realpath(other_path))):
                raise LabError(f"{flag} would replace this file, which {other} {other_path} reads", path)


READ_IN_DIRS = ("run.json", "best.json", "metrics.jsonl", "manifest.json", "results.json", "config.json",
                "generation_config.json", "chat_template.jinja", "tokenizer*", "vocab*", "merges.txt", "*.safetensors",
                "*.index.json", "*.bin", "*.pt", "*.model", "*.tiktoken")
"""Names of the files the lab reads in a run, drafter or target directory given as an input."""


def _read_in_dirs(path: Path) -> bool:
    return any(path.match(pattern) for pattern in READ_IN_DIRS)


def _through_link(path: Path) -> Path:
    """Where a write of `path` lands: `path`, or where a symbolic link `path` leads (through a chain of
    links). A dangling link's target is written too, if its directory exists."""
    if not os.path.islink(path):
        return path
    dest = Path(os.path.realpath(path))
    if os.path.islink(dest):  # realpath stops at a loop
        raise LabError("is a symbolic link that loops, leading to no file to write", path)
    if not dest.parent.is_dir():
        raise LabError(f"is a symbolic link to {dest}, whose directory does not exist", path)
    return dest


def _octal(m: re.Match) -> bytes:
    return bytes([int(m.group(1), 8)])


_MOUNTINFO = "/proc/self/mountinfo"


def _mount_points() -> set[str] | None:
    """The mount points of this process's mount namespace: the mount table's fifth field, where a space,
    tab, newline or backslash is an octal escape (\\040); None where there is no /proc."""
    try:
        with open(_MOUNTINFO, "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    return {os.fsdecode(re.sub(rb"\\([0-7]{3})", _octal, line.split(b" ", 5)[4])) for line in lines}


def _refuse_mount_point(path: Path, named: Path, below: bool = False) -> None:
    """A mount point (a container's volume, `docker run -v HOST:/out`) cannot be renamed over: the write's
    last step would fail with EBUSY, after all the work, its temp written to the file system beneath.
    The mount table finds a bind mount of the same file system too, whose st_dev (os.path.ismount's test,
    the one left where there is no /proc) is its parent's. `below`: a directory replaced whole is deleted
    with everything in it, the files of a volume mounted inside it too."""
    mounts = _mount_points()
    real = os.path.realpath(path)
    if os.path.ismount(path) if mounts is None else real in mounts:
        raise LabError("is a mount point, which cannot be replaced whole: name a path inside it", named)
    inner = sorted(m for m in mounts or () if below and m.startswith(real.rstrip("/") + "/"))
    if inner:
        raise LabError(f"holds a mount point, {inner[0]}, whose files replacing it whole would delete: "
                       "name another directory", named)


def _special(path: Path) -> bool:
    """Whether `path` is a device or a pipe (/dev/null, a shell's `>(...)`): written through, since a
    rename over it replaced the node itself (as root, /dev/null became a plain file)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _temp_beside(path: Path) -> tuple[Path, Path]:
    """A new temp file for a write of `path`, and the path it is renamed to (`_through_link`); for a
    device or pipe, a temp in the system's temp directory, copied through (`_commit`)."""
    dest = _through_link(path)
    if dest.is_dir():  # else the rename's traceback, after all the work that made the file
        raise LabError("is a directory: give the path of a file to write", path)
    if _special(dest):
        fd, tmp = tempfile.mkstemp(suffix=".tmp")
        os.close(fd)
        return Path(tmp), dest
    _refuse_mount_point(dest, path)
    make_parent(dest)
    clear_stale_temps(dest)
    try:
        fd, tmp = tempfile.mkstemp(prefix=_owner_prefix(dest), suffix=".tmp", dir=dest.parent)
    except OSError as e:  # no permission, a read-only or virtual file system (/proc), a full disk
        where = "here" if dest == path else f"in {dest.parent}"
        raise LabError(f"cannot write a file {where}: {e.strerror}", path) from None
    os.close(fd)
    _WRITING.add(os.path.basename(tmp))
    return Path(tmp), dest


def _commit(tmp: Path, path: Path) -> None:
    if _special(path):
        with open(tmp, "rb") as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        return
    with open(tmp, "rb+") as f:
        # mkstemp makes 0600, and some writers (safetensors) replace the file with their own
        # 0600 one: the result should look like any new file.
        os.fchmod(f.fileno(), 0o666 & ~_UMASK)
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path) -> None:
    """Make a rename into directory `path` durable: fsyncing a file keeps its bytes through a power
    loss, not its new name. A file system that cannot fsync a directory (some network and overlay
    mounts: EINVAL, EBADF) and a directory this user may write but not read are left as they are."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except PermissionError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory below `root` (its writers, save_pretrained or copytree, do not)."""
    for parent, _, files in os.walk(root):
        for name in files:
            file = os.path.join(parent, name)
            if not os.path.islink(file):
                fd = os.open(file, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        _fsync_dir(parent)


def _discard(old: Path, path: Path) -> None:
    """Delete `old`, moved first to a temp of `path`'s writers: a delete killed midway then leaves a temp
    that the next write clears, never part of `old` under its own name, which would be restored."""
    if not old.is_dir() or old.is_symlink():  # a file, which `path` was: deleted in one step
        old.unlink()
        return
    trash = tempfile.mkdtemp(prefix=_owner_prefix(path), suffix=".tmp", dir=path.parent)
    os.replace(old, trash)  # over the empty temp directory
    shutil.rmtree(trash, ignore_errors=True)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temp path beside `path` (beside the file a link `path` leads to); on success it is fsynced
    and renamed over that file."""
    tmp, dest = _temp_beside(Path(path))
    try:
        yield tmp
        _commit(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        _done(tmp)


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def finite(obj):
    """`obj` with every non-finite float (NaN, +-inf) as None, in dicts, lists and tuples at any depth:
    JSON has no such number, and the NaN / Infinity that Python's json writes are refused by jq,
    JSON.parse, Go and serde_json. A metric with nothing to measure (a loss over no position) reads null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def dumps(obj, **kwargs) -> str:
    """json.dumps (with its keywords) of `finite(obj)`: strict JSON, for every file or line the lab writes."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)


def nan_for_null(obj):
    """`finite` undone where a value is a number whenever it is set (a metrics record, a list of CKAs):
    null reads as NaN, so a reader's comparisons and formats see what they saw before files were strict JSON."""
    if obj is None:
        return math.nan
    if isinstance(obj, dict):
        return {k: nan_for_null(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [nan_for_null(v) for v in obj]
    return obj


def write_json(path, obj) -> None:
    write_text(path, dumps(obj, indent=2) + "\n")


def read_json(path, missing: str, owner=None):
    """The JSON value in `path`. A missing file is LabError(`missing`) naming `owner` (the directory
    the file belongs to; default the file); a file that cannot be read or does not parse is one naming the file."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):  # the latter: a directory in its path is a file
        raise LabError(missing, owner if owner is not None else path) from None
    except IsADirectoryError:
        raise LabError("is a directory, not a JSON file", path) from None
    except OSError as e:  # another user's 0600 file, a read error
        raise LabError(f"cannot read it: {e.strerror}", path) from None
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8 text, or nested too deep
        raise LabError(f"not valid JSON ({e})", path) from None


_SAFETENSORS_DTYPES = {
    "torch.float64": "F64", "torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16",
    "torch.int64": "I64", "torch.int32": "I32", "torch.int16": "I16", "torch.int8": "I8",
    "torch.uint8": "U8", "torch.bool": "BOOL",
}


class SafetensorsWriter:
    """A safetensors file whose layout is fixed up front and whose tensors are filled in any order,
    a block of rows at a time, each converted as it is written: a capture shard of a wide target is
    tens of GB, and no part of it needs to be in memory twice. Use it as a context manager: the file
    lands atomically when the block exits with every row written (once), and not at all otherwise.

    `layout` maps each key to its stored (dtype, shape). Tensors are laid out wider elements first
    (as safetensors does, so each starts at a multiple of its element size), then by key, and the
    header's keys are sorted: the same content gives the same bytes. (safetensors' own writer
    orders the metadata by hash, which changes from process to process.)"""

    def __init__(self, path, layout: dict, metadata: dict | None = None):
        import torch

        self.path = Path(path)
        self._dtype = {k: dtype for k, (dtype, _) in layout.items()}
        self._span: dict[str, tuple[int, int, int]] = {}  # key -> (data offset, bytes per row, rows)
        header: dict = {"__metadata__": metadata} if metadata else {}
        offset = 0
        for k in sorted(layout, key=lambda k: (-layout[k][0].itemsize, k)):
            dtype, shape = layout[k]
            row = dtype.itemsize * torch.Size(shape[1:]).numel()
            n = row * (shape[0] if shape else 1)
            header[k] = {"dtype": _SAFETENSORS_DTYPES[str(dtype)], "shape": list(shape), "data_offsets": [offset, offset + n]}
            self._span[k] = (offset, row, shape[0] if shape else 1)
            offset += n
        blob = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
        self._head = len(blob).to_bytes(8, "little") + blob
        self._rows: dict[str, list[list[int]]] = {}  # key -> sorted, disjoint [start, end) row ranges written

    def __enter__(self) -> SafetensorsWriter:
        self._tmp, self._dest = _temp_beside(self.path)
        self._fd = os.open(self._tmp, os.O_WRONLY)
        self._put(memoryview(self._head), 0)
        return self

    def write(self, key: str, row: int, tensor) -> None:
        """Store `tensor` (any device or dtype; scalars at row 0) as `key`'s rows from `row` on."""
        import torch

        base, row_bytes, rows = self._span[key]
        data = tensor.detach().to(device="cpu", dtype=self._dtype[key]).contiguous().reshape(-1).view(torch.uint8)
        if row < 0 or row * row_bytes + data.numel() > rows * row_bytes or data.numel() % max(row_bytes, 1):
            raise ValueError(f"{key}: {tuple(tensor.shape)} at row {row} does not fit its layout")
        self._claim(key, row, row + data.numel() // max(row_bytes, 1))
        self._put(memoryview(data.numpy()), len(self._head) + base + row * row_bytes)

    def _claim(self, key: str, start: int, end: int) -> None:
        """Mark rows [start, end) of `key` written: a row written twice would leave another never written
        that the byte count alone takes for written (its zeros committed as data)."""
        spans = self._rows.setdefault(key, [])
        i = bisect.bisect_left(spans, [start])
        if start < end and ((i < len(spans) and spans[i][0] < end) or (i and spans[i - 1][1] > start)):
            raise ValueError(f"{key}: rows {start}..{end - 1} overlap rows written before")
        if i and spans[i - 1][1] == start:  # adjacent blocks merge: a capture writes its rows in order
            spans[i - 1][1] = end
        elif start < end:
            spans.insert(i, [start, end])

    def _put(self, data: memoryview, offset: int) -> None:
        while data:  # one pwrite moves at most ~2 GB
            n = os.pwrite(self._fd, data, offset)
            data, offset = data[n:], offset + n

    def __exit__(self, kind, *_) -> None:
        os.close(self._fd)
        try:
            unwritten = sum(row_bytes * (rows - sum(end - start for start, end in self._rows.get(k, ())))
                            for k, (_, row_bytes, rows) in self._span.items())
            if kind is None and unwritten:
                raise ValueError(f"{unwritten} bytes of {self.path.name} were never written")
            if kind is None:
                _commit(self._tmp, self._dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)
            _done(self._tmp)


def save_safetensors(tensors: dict, path, metadata: dict | None = None) -> None:
    """Write tensors as a safetensors file, atomically and byte-deterministically (SafetensorsWriter)."""
    with SafetensorsWriter(path, {k: (t.dtype, list(t.shape)) for k, t in tensors.items()}, metadata) as w:
        for k, t in tensors.items():
            w.write(k, 0, t)


def torch_save(obj, path) -> None:
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux's renameat2 RENAME_EXCHANGE); False where the kernel,
    C library or file system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike):
    """Yield a temp directory beside `path`; on success it replaces `path` whole.

    An existing `path` is swapped with the temp in one step, so a reader (or a run killed meanwhile)
    never finds it missing. Where the system cannot swap, it is moved aside first, and a write killed
    between the two moves is undone by the next write of `path`. A link `path` stays, and the directory
    it leads to is replaced, as a file's write does: swapped with the link, the old directory would be
    left in place, its link in a temp."""
    named = Path(path)
    path = _through_link(named)
    # Swapped away, the current directory would leave the shell in a deleted one (`.` has no name to
    # put a temp beside). A current directory deleted already is none that this write could swap.
    with contextlib.suppress(FileNotFoundError):
        if Path.cwd().resolve().is_relative_to(path.resolve()):
            raise LabError("is (or holds) the current directory, which is written as a whole new directory; "
                           "run from another directory", named)
    _refuse_mount_point(path, named, below=True)
    make_parent(path)
    clear_stale_temps(path)
    old = path.with_name(f".{path.name}.old")  # always whole: it is deleted only under another name
    if old.exists():
        if path.exists():  # killed after the fallback's two moves: the new version landed
            _discard(old, path)
        else:  # killed between them
            os.replace(old, path)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=_owner_prefix(path), suffix=".tmp", dir=path.parent))
    except OSError as e:  # as _temp_beside's
        where = "here" if path == named else f"in {path.parent}"
        raise LabError(f"cannot write a directory {where}: {e.strerror}", named) from None
    _WRITING.add(tmp.name)
    try:
        tmp.chmod(0o777 & ~_UMASK)  # mkdtemp makes 0700
        yield tmp
        _fsync_tree(tmp)
        if not path.exists():
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        elif exchange(tmp, path):  # the old version, now at tmp, goes with it below
            _fsync_dir(path.parent)
        else:
            os.replace(path, old)
            os.replace(tmp, path)
            _fsync_dir(path.parent)
            os.replace(old, tmp)  # to go with tmp below
    finally:
        _remove(tmp)  # the old version is a file where `path` was one
        _done(tmp)


def sha256_file(path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
