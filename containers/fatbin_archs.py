#!/usr/bin/env python3
"""Lists the GPU architectures compiled into a shared object's CUDA fat binary, without cuobjdump.

    python3 fatbin_archs.py LIB.so [--expect 80,90,100,120]

Reads the ELF section `.nv_fatbin`: a sequence of fat binaries (magic 0xBA55ED50), each a list of
entries whose header carries the kind (1 = PTX, 2 = SASS/cubin) and the SM number. Prints one line
per kind and architecture with its entry count; with --expect, exits 1 when an SM lacks SASS.
"""

from __future__ import annotations

import argparse
import struct
import sys
from collections import Counter
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "ptx", 2: "sass"}


def elf_sections(data: bytes):
    """(name, offset, size) of each section of a little-endian ELF64 file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i):
        return struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)

    strtab = header(shstrndx)[4]
    for i in range(shnum):
        name_off, _, _, _, offset, size, *_ = header(i)
        start = strtab + name_off
        yield data[start:data.index(b"\0", start)].decode(), offset, size


def fatbin_entries(data: bytes) -> Counter:
    """Counter of (kind, sm) over every entry of every fat binary in `.nv_fatbin`."""
    found: Counter = Counter()
    for name, offset, size in elf_sections(data):
        if name != ".nv_fatbin":
            continue
        pos, end = offset, offset + size
        while pos + 16 <= end:
            magic, _version, header_size, body_size = struct.unpack_from("<IHHQ", data, pos)
            if magic != FATBIN_MAGIC:  # fat binaries are 8-byte aligned; skip padding
                pos += 8
                continue
            entry, stop = pos + header_size, pos + header_size + body_size
            while entry < stop:
                kind, _, entry_header, payload = struct.unpack_from("<HHII", data, entry)
                (sm,) = struct.unpack_from("<I", data, entry + 28)
                found[(KINDS.get(kind, str(kind)), sm)] += 1
                entry += entry_header + payload
            pos = stop
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lib", type=Path)
    ap.add_argument("--expect", default="", help="comma-separated SM numbers that must have SASS, e.g. 80,90")
    args = ap.parse_args(argv)
    found = fatbin_entries(args.lib.read_bytes())
    for (kind, sm), n in sorted(found.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{kind} sm_{sm}: {n}")
    if not found:
        print(f"{args.lib}: no CUDA fat binary")
    missing = [sm for sm in args.expect.split(",") if sm and ("sass", int(sm)) not in found]
    if missing:
        print(f"missing SASS for sm_{', sm_'.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
