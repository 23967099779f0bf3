"""Offline chat corpus built from a pinned snapshot of CPython's standard library.

Source: `SNAPSHOT`, a tar.xz of every `*.py` file of CPython 3.11.7's `Lib/` (as installed, so
without `site-packages`, `__pycache__` and directories named `test`, `tests` or `idle_test`),
shipped with the package under the PSF license (`cpython-LICENSE.txt` beside it). Pinning the text,
instead of reading the running interpreter's library, makes the targets the same on every machine
and in every image: a run made on a laptop reproduces inside the container. The text is real code
and real prose written by people; nothing is generated. `write_snapshot` rebuilds such an archive
from any directory (`source_files(source=DIR)` also reads a directory directly).

Every module-level function and class method with a docstring (at least `MIN_DOC_CHARS` long) and
a body besides the docstring becomes one ShareGPT-style conversation
(`{"id", "slice", "conversations": [{"role": "user", ...}, {"role": "assistant", ...}]}`) in one of
two slices that differ in domain and style:

- BASE ("write code"): the user names the function, its signature and the first paragraph of its
  docstring; the assistant answers with the function's source in a fenced code block.
- SHIFTED ("explain code"): the user pastes the source without its docstring and asks what it
  does; the assistant answers in English prose: the docstring.

Each function lands in exactly one slice, and a held-out part of each slice is never trained on;
both choices come from a sha256 of (seed, function name), so the corpus is a pure function of
(source files, seed, options).
"""

from __future__ import annotations

import ast
import hashlib
import io
import lzma
import os
import tarfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from drafter_lab.atomic import atomic_path
from drafter_lab.errors import LabError

# Bump when the conversion below changes, so caches keyed on the corpus hash are invalidated.
FORMAT_VERSION = 1
SKIP_DIRS = frozenset({"site-packages", "__pycache__", "test", "tests", "idle_test"})
MIN_DOC_CHARS = 40
MAX_SUMMARY_CHARS = 400
SNAPSHOT = Path(__file__).with_name("corpus") / "cpython-3.11.7-lib.tar.xz"


@dataclass(frozen=True)
class SourceFile:
    """One corpus file: its path relative to the library root (which names the module) and bytes."""

    relpath: str
    data: bytes


def source_files(max_files: int = 0, source: Path = SNAPSHOT) -> list[SourceFile]:
    """The corpus files of `source` (a snapshot archive or a directory) in their fixed order, sorted
    by relative path; `max_files` > 0 keeps that many, evenly spread."""
    files = _read_snapshot(source) if source.is_file() else _read_dir(source)
    if 0 < max_files < len(files):
        step = len(files) / max_files
        files = [files[int(i * step)] for i in range(max_files)]
    return files


def _read_dir(root: Path) -> list[SourceFile]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]  # prune: never walk site-packages
        found += [Path(dirpath, f) for f in filenames if f.endswith(".py")]
    if not found:
        raise LabError("no Python sources found for the corpus", root)
    return sorted((SourceFile(p.relative_to(root).as_posix(), _read_bytes(p)) for p in found), key=lambda f: f.relpath)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:  # a dangling link, another user's 0600 file
        raise LabError(f"cannot read this corpus source: {e.strerror}", path) from None


def _read_snapshot(path: Path) -> list[SourceFile]:
    try:
        with tarfile.open(path, "r:xz") as tar:
            files = [
                SourceFile(m.name, tar.extractfile(m).read())
                for m in tar.getmembers()
                if m.isfile() and m.name.endswith(".py")
            ]
    except (OSError, tarfile.TarError, EOFError, lzma.LZMAError) as e:  # LZMAError: corrupt past the header
        raise LabError(f"cannot read the corpus snapshot: {e}", path) from e
    if not files:
        raise LabError("the corpus snapshot holds no Python sources", path)
    return sorted(files, key=lambda f: f.relpath)


def write_snapshot(root: Path, out: Path) -> int:
    """Archive the corpus files under directory `root` into `out` (tar.xz), byte-for-byte
    repeatable: sorted members, no times or owners. Returns the number of files."""
    files = source_files(source=root)
    with atomic_path(out) as tmp, tarfile.open(tmp, mode="w:xz", preset=9) as tar:
        for f in files:
            info = tarfile.TarInfo(f.relpath)
            info.size, info.mode = len(f.data), 0o644
            tar.addfile(info, io.BytesIO(f.data))
    return len(files)


def corpus_hash(files: list[SourceFile]) -> str:
    """sha256 over the format version and each file's relative path and bytes, each field ended by a NUL.

    A NUL inside a field is escaped (as \\x01\\x02, and \\x01 as \\x01\\x01), so no two lists of files hash
    alike: unescaped, [a.py: b"x\\0b.py\\0y"] hashed as [a.py: b"x", b.py: b"y"]. Fields with neither byte
    (every file of the snapshot) hash as they did before the escape, so the cache keys built on it stay."""
    h = hashlib.sha256(f"corpus-format-{FORMAT_VERSION}".encode())
    for f in files:
        for field in (f.relpath.encode(), f.data):
            h.update(field.replace(b"\1", b"\1\1").replace(b"\0", b"\1\2") + b"\0")
    return h.hexdigest()


def _unit(seed: int, tag: str, name: str) -> float:
    """A deterministic number in [0, 1) for (seed, tag, name)."""
    digest = hashlib.sha256(f"{seed}:{tag}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _module_name(relpath: str) -> str:
    parts = relpath.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    sig = f"({ast.unparse(fn.args)})"
    return sig + (f" -> {ast.unparse(fn.returns)}" if fn.returns is not None else "")


def _functions(tree: ast.Module):
    """(qualname, node) for module-level functions and methods of module-level classes."""
    fn_types = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, fn_types):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, fn_types):
                    yield f"{node.name}.{item.name}", item


def _paragraphs_within(text: str, limit: int) -> str:
    """Leading paragraphs of `text` that fit in `limit` characters (at least the first one)."""
    paras = text.split("\n\n")
    out = paras[0]
    for p in paras[1:]:
        if len(out) + 2 + len(p) > limit:
            break
        out += "\n\n" + p
    return out


def _examples_in(f: SourceFile, max_source_chars: int, too_long: list[str]):
    """The examples of `f`; the functions left out only for being longer than `max_source_chars` are
    added to `too_long`, so that a corpus too small can say which option to raise."""
    text = f.data.decode("utf-8", errors="replace").expandtabs(8)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return
    # The lines as ast numbers them: str.splitlines also ends one at \f (older sources put form feeds
    # between sections), \x1c..\x1e, \x85 or \u2028, and showed every function after it a line early.
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    module = _module_name(f.relpath)
    for qualname, fn in _functions(tree):
        doc = (ast.get_docstring(fn, clean=True) or "").strip()
        if not doc or len(doc) < MIN_DOC_CHARS or len(fn.body) < 2:
            continue
        body = lines[fn.lineno - 1 : fn.end_lineno]
        source = textwrap.dedent("\n".join(body))
        if len(source) > max_source_chars:
            too_long.append(f"{module}.{qualname}")
            continue
        bare = textwrap.dedent("\n".join(_without(body, fn.lineno, fn.body[0])))
        yield module, qualname, fn.lineno, _signature(fn), doc, source, bare


def _without(lines: list[str], first: int, node: ast.stmt) -> list[str]:
    """`lines` (the first numbered `first`) without the text of `node`, a docstring, and a comment after
    it. Code sharing a line with it stays (the header of a one-line `def`, statements after it less their
    `;`); a line left blank goes."""
    a, b = node.lineno - first, node.end_lineno - first
    head = lines[a].encode()[: node.col_offset].decode()  # ast's columns count UTF-8 bytes
    tail = lines[b].encode()[node.end_col_offset :].decode().lstrip().removeprefix(";").lstrip()
    rest = (head + ("" if tail.startswith("#") else tail)).rstrip()
    return lines[:a] + ([rest] if rest.strip() else []) + lines[b + 1 :]


def _base_conversation(module, qualname, signature, doc, source) -> list[dict]:
    summary = _paragraphs_within(doc, MAX_SUMMARY_CHARS)[:MAX_SUMMARY_CHARS]
    ask = f"Write `{qualname}{signature}` for the `{module}` module.\n\n{summary}"
    return [
        {"role": "user", "content": ask},
        {"role": "assistant", "content": f"```python\n{source}\n```"},
    ]


def _shifted_conversation(module, qualname, bare, doc) -> list[dict]:
    """The whole docstring answers: it is part of a source within max_source_chars, so no cap binds."""
    ask = f"What does this function from `{module}` do?\n\n```python\n{bare}\n```"
    return [
        {"role": "user", "content": ask},
        {"role": "assistant", "content": doc},
    ]


@dataclass
class Corpus:
    """The two slices, each split into training conversations and a held-out part."""

    base: list[dict]
    shifted: list[dict]
    heldout_base: list[dict]
    heldout_shifted: list[dict]
    files: int
    hash: str

    def summary(self) -> dict:
        return {
            "source": SNAPSHOT.name,
            "files": self.files,
            "hash": self.hash,
            "format_version": FORMAT_VERSION,
            "conversations": {
                "base": len(self.base),
                "shifted": len(self.shifted),
                "heldout_base": len(self.heldout_base),
                "heldout_shifted": len(self.heldout_shifted),
            },
        }


def build_corpus(
    files: list[SourceFile],
    *,
    seed: int,
    shifted_share: float,
    heldout_per_slice: int,
    max_source_chars: int,
    content_hash: str | None = None,
) -> Corpus:
    """Convert `files` (from `source_files`) into the two slices, deterministically for `seed`.

    `shifted_share` of the functions go to the SHIFTED slice; the first `heldout_per_slice` of each
    slice (in seeded hash order) are held out from training. Conversation order is that same
    seeded order, so it does not depend on the file walk.
    """
    slices: dict[str, list[tuple[float, dict]]] = {"base": [], "shifted": []}
    too_long: list[str] = []
    defined: set[str] = set()
    for f in files:
        examples = _examples_in(f, max_source_chars, too_long)
        for module, qualname, line, signature, doc, source, bare in examples:
            name = f"{module}.{qualname}"
            # A property's setter, a redefinition, pkg/m.py beside pkg/m/__init__.py: a namesake's id names
            # where it is, or the data reader would drop it as a duplicate after the split had counted it.
            name = f"{name}@{f.relpath}:{line}" if name in defined else name
            defined.add(name)
            if _unit(seed, "slice", name) < shifted_share:
                kind, conv = "shifted", _shifted_conversation(module, qualname, bare, doc)
            else:
                kind, conv = "base", _base_conversation(module, qualname, signature, doc, source)
            record = {"id": f"{kind}:{name}", "slice": kind, "conversations": conv}
            slices[kind].append((_unit(seed, "order", name), record))
    ordered = {k: [r for _, r in sorted(v, key=lambda t: (t[0], t[1]["id"]))] for k, v in slices.items()}
    for kind, records in ordered.items():
        if len(records) < heldout_per_slice + 1:
            cut = (f"; {len(too_long)} functions longer than max_source_chars={max_source_chars} were left out"
                   if too_long else "")
            raise LabError(
                f"corpus too small: the {kind} slice has {len(records)} conversations, "
                f"need more than {heldout_per_slice} held out (from {len(files)} files){cut}"
            )
    return Corpus(
        base=ordered["base"][heldout_per_slice:],
        shifted=ordered["shifted"][heldout_per_slice:],
        heldout_base=ordered["base"][:heldout_per_slice],
        heldout_shifted=ordered["shifted"][:heldout_per_slice],
        files=len(files),
        hash=content_hash or corpus_hash(files),
    )
