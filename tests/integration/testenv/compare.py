"""Run one file-operation scenario on a plain directory and on a mount.

A scenario is a function `scenario(d: Path) -> list` that performs operations
below `d` and returns what it observed.  Wrap every call whose failure matters
in `attempt()`, which turns an OSError into ("err", "ENOENT"), so that the
errno is part of the comparison.  `same_as_plain()` runs the scenario in a
fresh subdirectory of both trees and asserts the observations are equal.
"""

import errno
import os
import stat
from pathlib import Path


def ename(e):
    return errno.errorcode.get(e, str(e))


def attempt(fn, *args, **kw):
    """("ok", result) or ("err", "EXXX")."""
    try:
        return ("ok", fn(*args, **kw))
    except OSError as e:
        return ("err", ename(e.errno))


def err_of(fn, *args, **kw):
    """The errno name fn raised, or "ok"."""
    try:
        fn(*args, **kw)
        return "ok"
    except OSError as e:
        return ename(e.errno)


def st_facts(st, times=False):
    """The comparable part of a stat result (no inode, device or times)."""
    d = {
        "type": stat.S_IFMT(st.st_mode),
        "mode": stat.S_IMODE(st.st_mode),
        "size": st.st_size if not stat.S_ISDIR(st.st_mode) else "dir",
        "nlink": st.st_nlink,
        "uid": st.st_uid,
        "gid": st.st_gid,
    }
    if times:
        d["mtime_ns"] = st.st_mtime_ns
        d["atime_ns"] = st.st_atime_ns
    return d


def lstat_facts(p, times=False):
    try:
        return st_facts(os.lstat(p), times)
    except OSError as e:
        return ename(e.errno)


def read_bytes(p):
    try:
        return Path(p).read_bytes()
    except OSError as e:
        return ("err", ename(e.errno))


def tree(d):
    """{relpath: facts + content} of everything below d (for final states)."""
    out = {}
    for root, dirs, files in os.walk(d):
        for n in sorted(dirs + files):
            p = os.path.join(root, n)
            rel = os.path.relpath(p, d)
            st = os.lstat(p)
            f = st_facts(st)
            if stat.S_ISREG(st.st_mode):
                f["data"] = Path(p).read_bytes()
            elif stat.S_ISLNK(st.st_mode):
                f["link"] = os.readlink(p)
            out[rel] = f
    return out


_counter = [0]


def same_as_plain(plain_root, mount_root, scenario, label=None):
    """Run scenario in <plain_root>/<label> and <mount_root>/<label>.

    Asserts both observation lists are equal, element by element (so that a
    failure names the first differing step), and returns the mount's.
    """
    _counter[0] += 1
    label = label or f"{scenario.__name__}-{_counter[0]}"
    a_dir = Path(plain_root) / label
    b_dir = Path(mount_root) / label
    a_dir.mkdir(parents=True)
    b_dir.mkdir(parents=True)
    want = scenario(a_dir)
    got = scenario(b_dir)
    assert isinstance(want, list), "a scenario returns a list"
    for i, (w, g) in enumerate(zip(want, got)):
        assert g == w, (f"step {i} differs from the plain directory:\n"
                        f"  plain: {w!r}\n  mount: {g!r}")
    assert len(got) == len(want)
    return got
