"""Review s60 (atomic): an output path that is a symbolic link is written where it leads, the link kept; a bind
mount of the same file system is found in the mount table (as s59's tmpfs, another one, is), and a directory
holding a mount is not replaced."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from drafter_lab import atomic
from drafter_lab.errors import LabError


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("write, read", [
    (lambda p: atomic.write_json(p, {"a": 1}), lambda p: p.read_text()),
    (lambda p: atomic.write_text(p, "new\n"), lambda p: p.read_text()),
    (lambda p: atomic.torch_save({"a": 1}, p), lambda p: torch.load(p)),
    (lambda p: atomic.save_safetensors({"w": torch.ones(2)}, p), lambda p: load_file(p)["w"].tolist()),
], ids=["json", "text", "torch", "safetensors"])
def test_a_file_written_through_a_link_keeps_the_link_and_updates_its_target(tmp_path, write, read):
    """`--json served.json` with served.json -> ../shared/served.json: the rename replaced the link by a file,
    and the shared file kept its old content."""
    (tmp_path / "shared").mkdir()
    (tmp_path / "run").mkdir()
    target = tmp_path / "shared" / "served.json"
    target.write_text("old")
    (tmp_path / "shared" / "hop").symlink_to("served.json")  # a chain of links, relative ones
    link = tmp_path / "run" / "served.json"
    link.symlink_to("../shared/hop")
    expect = tmp_path / "expect"
    write(expect)
    write(link)
    assert link.is_symlink() and os.readlink(link) == "../shared/hop"
    assert not target.is_symlink() and read(target) == read(expect)
    assert _tree(tmp_path) == ["expect", "run", "run/served.json", "shared", "shared/hop", "shared/served.json"]


def test_a_write_through_a_link_clears_the_stale_temps_beside_its_target(tmp_path):
    (tmp_path / "shared").mkdir()
    target = tmp_path / "shared" / "r.json"
    target.write_text("old")
    (tmp_path / "r.json").symlink_to(target)
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    stale = tmp_path / "shared" / f".r.json.{dead.pid}@{os.uname().nodename}.x1y2.tmp"
    stale.write_text("half")
    atomic.write_json(tmp_path / "r.json", [1])
    assert not stale.exists() and target.read_text() == "[\n  1\n]\n"


def test_a_dangling_link_writes_its_target_where_its_directory_exists(tmp_path):
    link = tmp_path / "out.json"
    link.symlink_to(tmp_path / "gone.json")
    atomic.write_json(link, {})
    assert link.is_symlink() and (tmp_path / "gone.json").read_text() == "{}\n"


def test_a_link_that_leads_nowhere_writable_is_one_line_naming_it(tmp_path):
    """Before, a dangling link into a missing directory, and a loop, were replaced by a file."""
    dangling, loop = tmp_path / "out.json", tmp_path / "a"
    dangling.symlink_to(tmp_path / "nodir" / "out.json")
    loop.symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    for link, why in ((dangling, f"is a symbolic link to {tmp_path}/nodir/out.json, whose directory does not exist"),
                      (loop, "is a symbolic link that loops, leading to no file to write")):
        for write in (lambda p: atomic.write_json(p, {}), lambda p: atomic.refuse_unwritable(p, "--json")):
            with pytest.raises(LabError) as e:
                write(link)
            assert str(e.value) == f"{link}: {why}"
    assert _tree(tmp_path) == ["a", "b", "out.json"] and dangling.is_symlink() and loop.is_symlink()


def test_a_link_to_a_directory_is_refused_as_a_directory_is(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "l").symlink_to("d")
    with pytest.raises(LabError, match="l: is a directory"):
        atomic.write_json(tmp_path / "l", {})
    with pytest.raises(LabError, match="l: is a directory"):
        atomic.refuse_unwritable(tmp_path / "l", "--json")


@pytest.mark.parametrize("swap", [True, False], ids=["exchange", "two-moves"])
def test_a_directory_written_through_a_link_replaces_the_directory_it_leads_to(tmp_path, monkeypatch, swap):
    """Swapped with the temp, the link went to a temp (left behind: rmtree refuses a link) and the linked
    directory kept its old files."""
    if not swap:
        monkeypatch.setattr(atomic, "exchange", lambda a, b: False)
    (tmp_path / "shared" / "d").mkdir(parents=True)
    (tmp_path / "shared" / "d" / "old").write_text("old")
    link = tmp_path / "d"
    link.symlink_to("shared/d")
    with atomic.atomic_dir(link) as tmp:
        assert tmp.parent == tmp_path / "shared"
        (tmp / "new").write_text("new")
    assert link.is_symlink() and os.readlink(link) == "shared/d"
    assert _tree(tmp_path) == ["d", "shared", "shared/d", "shared/d/new"]


MOUNTED = """
import sys
from pathlib import Path
from drafter_lab import atomic
from drafter_lab.errors import LabError
vol, file, link, holder = map(Path, sys.argv[1:])

def directory(path):
    with atomic.atomic_dir(path) as tmp:
        (tmp / "f").write_text("new")

for name, write in (("dir", lambda: directory(vol)), ("link", lambda: directory(link)),
                    ("holder", lambda: directory(holder)), ("file", lambda: atomic.write_json(file, {"a": 1})),
                    ("check", lambda: atomic.refuse_unwritable(file, "--json"))):
    try:
        write()
        print(name, "written")
    except LabError as e:
        print(name, "error:", e)
    except OSError as e:
        print(name, type(e).__name__, e)
"""


# Either kind mounts the same three places: the volume, the file, and a directory inside the holder.
MOUNTS = {
    # another file system: a tmpfs; the file a tmpfs file bound over it
    "tmpfs": "mount -t tmpfs none '{vol}' && mount -t tmpfs none '{src}' && touch '{src}/f' && mkdir '{src}/data' && "
             "mount --bind '{src}/f' '{file}' && mount --bind '{src}/data' '{holder}/cache'",
    # the same file system: bind mounts of the disk's own directories
    "bind": "mount --bind '{src}' '{vol}' && mount --bind '{src}/f' '{file}' && "
            "mount --bind '{src}/data' '{holder}/cache'",
}


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare")
@pytest.mark.parametrize("kind", MOUNTS)
def test_a_mount_point_is_refused_in_one_line_before_anything_is_written(tmp_path, kind):
    """`docker run -v $PWD/out:/out IMG export --out /out`: the temp went to the file system beneath the volume,
    and the final rename failed with OSError EBUSY, a traceback after all the work. A bind mount of the disk the
    container's files are on has the same st_dev as its parent, so os.path.ismount missed it. A directory holding
    a mount was replaced, and the old one's delete emptied the volume."""
    vol, file, src = tmp_path / "the vol", tmp_path / "result.json", tmp_path / "src"  # \040 in mountinfo
    holder, link = tmp_path / "holder", tmp_path / "link"
    for d in (vol, src, holder / "cache", src / "data"):
        d.mkdir(parents=True)
    file.write_text("old")
    (src / "f").write_text("mounted")
    (src / "data" / "keep").write_text("keep")
    link.symlink_to(vol)
    # a private mount namespace keeps the mounts from the host
    script = (MOUNTS[kind].format(vol=vol, src=src, file=file, holder=holder) + " || exit 77; "
              f"exec {sys.executable} -c \"$0\" \"$@\"")
    unshare = ["unshare", "-m", "--propagation", "private"] if os.geteuid() == 0 else ["unshare", "-rm"]
    r = subprocess.run([*unshare, "sh", "-c", script, MOUNTED, vol, file, link, holder], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode == 77 or "unshare failed" in r.stderr:
        pytest.skip(f"cannot mount here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    mounted = "is a mount point, which cannot be replaced whole: name a path inside it"
    assert r.stdout.splitlines() == [
        f"dir error: {vol}: {mounted}", f"link error: {link}: {mounted}",
        f"holder error: {holder}: holds a mount point, {holder}/cache, whose files replacing it whole would "
        "delete: name another directory",
        f"file error: {file}: {mounted}", f"check error: {file}: {mounted}"]
    # no temp left, nothing deleted
    assert _tree(tmp_path) == ["holder", "holder/cache", "link", "result.json", "src", "src/data", "src/data/keep",
                               "src/f", "the vol"]
    assert file.read_text() == "old" and (src / "f").read_text() == "mounted"


def test_the_mount_table_is_read_with_its_escapes(tmp_path, monkeypatch):
    """mountinfo writes a space, tab, newline and backslash in a mount point as \\ooo."""
    table = tmp_path / "mountinfo"
    table.write_bytes(b"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
                      b"36 22 8:1 /x /mnt/a\\040b\\011c\\134d rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
                      b"37 22 8:1 /y /mnt/\xc3\xa9 rw - ext4 /dev/sda1 rw\n")
    monkeypatch.setattr(atomic, "_MOUNTINFO", str(table))
    assert atomic._mount_points() == {"/", "/mnt/a b\tc\\d", "/mnt/é"}


def test_without_proc_a_mount_point_is_one_of_another_file_system(tmp_path, monkeypatch):
    """No /proc (a sandbox): os.path.ismount's test, a file system other than its parent's."""
    monkeypatch.setattr(atomic, "_MOUNTINFO", str(tmp_path / "none"))
    assert atomic._mount_points() is None
    root = os.path.realpath("/")
    with pytest.raises(LabError, match="is a mount point"):
        atomic._refuse_mount_point(root, root)
    atomic._refuse_mount_point(tmp_path, tmp_path, below=True)
