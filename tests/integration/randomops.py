#!/usr/bin/env python3
"""Differential random-operation tester for sbx mounts (with fault phases).

Several worker processes each run a random sequence of file operations in
their own subdirectory `p<I>`.  Every operation is applied to the mount's
subdirectory and to the same subdirectory of a plain directory on the same
host file system, and the two results are compared op by op: return value,
errno, bytes read, st_size, st_nlink, mode, file type, directory listings.
Inode numbers, times, st_dev and block counts are ignored.

Standalone:

    python3 tests/integration/randomops.py --mount MNT --plain DIR \
        --seed N --procs 4 --ops 2000 [--time-limit 60] [--only-proc I] \
        [--keep-going K] [--shrink] [--exclude longname,mmap]

The seed is printed first.  Worker I derives its RNG from (seed, I, phase),
so `--seed N` replays a run exactly, and `--seed N --only-proc I
--ops M` replays the first M operations of worker I alone.  On a mismatch
the report names the seed, worker, phase, op index, the op and both
results, and the last 20 operations of that worker; `--shrink` then
reduces the worker's operation list to a minimal one that still fails the
same way (delta debugging, each trial in fresh directories) and prints it,
and `--replay FILE` runs such a list (JSON) again.

Nothing that can block on the FUSE mount runs in the controlling process:
every access to the mount is made by a worker process, which journals
each operation before and after it runs (to a file outside the mount).
The controller reads the journals; an operation running longer than
--op-timeout (30 s) is reported as a HANG, with the op and the worker's
last operations, and the worker is abandoned (a process blocked in a FUSE
request may be unkillable; the controller never waits for it).

The fault phase (remote sandboxes; driven by test_randomops.py through
run(), which takes fault actions as callables) is described in
docs/testing.md, "Random operation tester".
"""

import argparse
import collections
import errno
import fcntl
import json
import mmap
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

OP_TIMEOUT = 30.0
HISTORY = 20
MAX_SLOTS = 6
LONG = "L" * 256          # longer than NAME_MAX (255): ENAMETOOLONG

# The diff phase's name space (relative to the worker's directory).  Few
# names, so that operations collide: renames over existing files, links,
# EEXIST/ENOENT/ENOTDIR/EISDIR/ENOTEMPTY all happen often.
FILES = ["a", "b", "c", "d", "sub/a", "sub/b", "sub/deep/c", "x/a"]
DIRS = ["sub", "sub/deep", "x", "y"]

FLAG_BITS = {
    "O_RDONLY": os.O_RDONLY, "O_WRONLY": os.O_WRONLY, "O_RDWR": os.O_RDWR,
    "O_CREAT": os.O_CREAT, "O_EXCL": os.O_EXCL, "O_TRUNC": os.O_TRUNC,
    "O_APPEND": os.O_APPEND,
}
OPEN_FLAGS = [
    (["O_RDONLY"], 4), (["O_RDWR"], 5), (["O_WRONLY"], 2),
    (["O_RDWR", "O_CREAT"], 8), (["O_WRONLY", "O_CREAT"], 2),
    (["O_RDWR", "O_CREAT", "O_TRUNC"], 3), (["O_WRONLY", "O_TRUNC"], 2),
    (["O_WRONLY", "O_CREAT", "O_TRUNC"], 3),
    (["O_WRONLY", "O_APPEND"], 2), (["O_RDWR", "O_CREAT", "O_APPEND"], 3),
    (["O_RDWR", "O_CREAT", "O_EXCL"], 3), (["O_WRONLY", "O_CREAT", "O_EXCL"], 1),
    (["O_RDONLY", "O_TRUNC"], 1),
]

# Operation classes that --exclude can remove (comma separated).
OP_CLASSES = {
    "open": ["open"], "close": ["close"], "read": ["read", "pread"],
    "write": ["write", "pwrite"], "lseek": ["lseek"],
    "truncate": ["truncate", "ftruncate"], "fsync": ["fsync"],
    "stat": ["stat", "fstat"], "listdir": ["listdir"],
    "readfile": ["readfile"], "rename": ["rename"], "link": ["link"],
    "unlink": ["unlink"], "dirs": ["mkdir", "rmdir"],
    "copy_file_range": ["cfr"], "mmap": ["mmapw"],
    "longname": [],        # the over-long name in the path pool
}

DIFF_WEIGHTS = {
    "open": 12, "close": 8, "read": 4, "pread": 5, "write": 8, "pwrite": 8,
    "lseek": 2, "ftruncate": 3, "truncate": 3, "fsync": 3, "fstat": 5,
    "stat": 5, "listdir": 4, "readfile": 5, "rename": 5, "link": 3,
    "unlink": 5, "mkdir": 3, "rmdir": 2, "cfr": 4, "mmapw": 3,
}
FD_OPS = {"close", "read", "pread", "write", "pwrite", "lseek", "ftruncate",
          "fsync", "fstat", "cfr", "mmapw"}


def ename(e):
    return errno.errorcode.get(e, str(e))


# -- data ------------------------------------------------------------------------
#
# Written data is described by ["D", seed, length] in operations, so that an
# operation list is small, printable and replayable.

_data_cache = collections.OrderedDict()


def data_of(d):
    key = (d[1], d[2])
    b = _data_cache.get(key)
    if b is None:
        b = random.Random(d[1]).randbytes(d[2])
        _data_cache[key] = b
        if len(_data_cache) > 16:
            _data_cache.popitem(last=False)
    return b


def crc(b):
    return f"{zlib.crc32(b) & 0xffffffff:08x}"


def show_val(v):
    if isinstance(v, (bytes, bytearray)):
        if len(v) <= 24:
            return repr(bytes(v))
        return f"<{len(v)} bytes crc={crc(v)}>"
    if isinstance(v, list) and v and v[0] == "D":
        return f"<{v[2]} bytes #{v[1]}>"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {show_val(x)}" for k, x in v.items()) + "}"
    return repr(v)


def show_result(r):
    if r[0] == "ok":
        return "ok" if r[1] is None else f"ok {show_val(r[1])}"
    return " ".join(map(str, r))


def show_op(op, info=None):
    name, args = op[0], op[1:]
    parts = []
    for i, a in enumerate(args):
        if name == "open" and i == 1:
            parts.append("|".join(a))
        elif name == "open" and i == 2:
            parts.append(oct(a))
        elif name == "mkdir" and i == 1:
            parts.append(oct(a))
        elif name == "lseek" and i == 2:
            parts.append(["SEEK_SET", "SEEK_CUR", "SEEK_END"][a])
        else:
            parts.append(show_val(a))
    s = f"{name}({', '.join(parts)})"
    if info:
        s += f"  [{info}]"
    return s


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def explain(rp, rm):
    """Extra detail for two differing results (byte strings, trees)."""
    if rp[0] == rm[0] == "ok":
        a, b = rp[1], rm[1]
        if isinstance(a, (bytes, bytearray)) and isinstance(b, (bytes, bytearray)):
            i = first_diff(a, b)
            return (f"  lengths plain={len(a)} mount={len(b)}; first "
                    f"difference at byte {i}: plain {bytes(a[i:i+16])!r} "
                    f"mount {bytes(b[i:i+16])!r}")
        if isinstance(a, dict) and isinstance(b, dict):
            lines = []
            for k in sorted(set(a) | set(b)):
                if a.get(k) != b.get(k):
                    lines.append(f"  {k}: plain {show_val(a.get(k))} "
                                 f"mount {show_val(b.get(k))}")
            return "\n".join(lines[:20])
        if isinstance(a, list) and isinstance(b, list):
            return (f"  only in plain: {sorted(set(a) - set(b))}; only in "
                    f"mount: {sorted(set(b) - set(a))}")
    return ""


# -- comparable facts ------------------------------------------------------------


def facts(st):
    """What is compared of a stat result (no inode, device, times, blocks;
    no size for directories, which differs between file systems)."""
    return {"type": stat.S_IFMT(st.st_mode), "mode": stat.S_IMODE(st.st_mode),
            "size": "dir" if stat.S_ISDIR(st.st_mode) else st.st_size,
            "nlink": st.st_nlink}


def tree_facts(root):
    """{relpath: facts + crc of the content} of everything below root."""
    out = {}
    for top, dirs, files in os.walk(root):
        dirs.sort()
        for n in sorted(dirs + files):
            p = os.path.join(top, n)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            f = facts(st)
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as fh:
                    b = fh.read()
                f["data"] = f"{len(b)}:{crc(b)}"
            out[rel] = f
    return out


# -- one side of the comparison ----------------------------------------------------


class Side:
    """A directory tree and the descriptors open in it (by slot)."""

    def __init__(self, root):
        self.root = str(root)
        self.fds = {}

    def p(self, rel):
        return os.path.join(self.root, rel) if rel != "." else self.root

    def close_all(self):
        for s in list(self.fds):
            try:
                os.close(self.fds.pop(s))
            except OSError:
                pass

    # Each op_* returns a comparable value or raises OSError.

    def op_open(self, path, flags, mode, slot):
        if slot in self.fds:          # (replays of shrunk lists only)
            try:
                os.close(self.fds.pop(slot))
            except OSError:
                pass
        fl = 0
        for f in flags:
            fl |= FLAG_BITS[f]
        self.fds[slot] = os.open(self.p(path), fl | os.O_CLOEXEC, mode)

    def fd(self, slot):
        if slot not in self.fds:
            raise _NoSlot()
        return self.fds[slot]

    def op_close(self, slot):
        fd = self.fd(slot)
        del self.fds[slot]
        os.close(fd)

    def op_read(self, slot, n):
        return os.read(self.fd(slot), n)

    def op_pread(self, slot, n, off):
        return os.pread(self.fd(slot), n, off)

    def op_write(self, slot, d):
        return os.write(self.fd(slot), data_of(d))

    def op_pwrite(self, slot, d, off):
        return os.pwrite(self.fd(slot), data_of(d), off)

    def op_lseek(self, slot, off, whence):
        return os.lseek(self.fd(slot), off, whence)

    def op_ftruncate(self, slot, size):
        os.ftruncate(self.fd(slot), size)

    def op_truncate(self, path, size):
        os.truncate(self.p(path), size)

    def op_fsync(self, slot):
        os.fsync(self.fd(slot))

    def op_fstat(self, slot):
        return facts(os.fstat(self.fd(slot)))

    def op_stat(self, path):
        return facts(os.lstat(self.p(path)))

    def op_listdir(self, path):
        return sorted(os.listdir(self.p(path)))

    def op_readfile(self, path):
        fd = os.open(self.p(path), os.O_RDONLY | os.O_CLOEXEC)
        try:
            chunks = []
            while True:
                b = os.read(fd, 1 << 20)
                if not b:
                    break
                chunks.append(b)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def op_rename(self, a, b):
        os.rename(self.p(a), self.p(b))

    def op_link(self, a, b):
        os.link(self.p(a), self.p(b), follow_symlinks=False)

    def op_unlink(self, path):
        os.unlink(self.p(path))

    def op_mkdir(self, path, mode):
        os.mkdir(self.p(path), mode)

    def op_rmdir(self, path):
        os.rmdir(self.p(path))

    def op_cfr(self, src, dst, count, off_src, off_dst):
        return os.copy_file_range(self.fd(src), self.fd(dst), count,
                                  off_src, off_dst)

    def op_mmapw(self, slot, off, d):
        """Write d at off through a shared mapping of the whole file, then
        msync; the write is clipped to this side's file size (so that a
        size the two sides disagree on shows as a different result rather
        than a SIGBUS)."""
        fd = self.fd(slot)
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            return "directory"   # (mmap of one: ENODEV, size is fs-specific)
        # A shared writable mapping needs a descriptor open for reading and
        # writing: EACCES otherwise, whatever the size (checked first, as
        # the kernel does, so that sizes do not decide the outcome here).
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDWR:
            raise OSError(errno.EACCES, "mmap: descriptor not O_RDWR")
        size = st.st_size
        if size == 0 or off >= size:
            return ("no room", size)
        b = data_of(d)[:size - off]
        try:
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED,
                           mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            raise
        except ValueError as e:          # e.g. "mmap length is greater..."
            return ("ValueError", str(e))
        try:
            mm[off:off + len(b)] = b
            mm.flush()
        finally:
            mm.close()
        return len(b)

    def op_tree(self):
        return tree_facts(self.root)

    def run(self, op):
        try:
            return ("ok", getattr(self, "op_" + op[0])(*op[1:]))
        except _NoSlot:
            return ("noslot",)
        except OSError as e:
            return ("err", ename(e.errno))


class _NoSlot(Exception):
    pass


def normal(r):
    """JSON round trip (tuples become lists) so results compare equal
    whatever produced them."""
    if r[0] == "ok" and isinstance(r[1], tuple):
        return ("ok", list(r[1]))
    return r


# -- the diff phase's generator -----------------------------------------------------


class DiffGen:
    """Random operations, chosen from the plain side's state only (so the
    sequence is a function of the seed, whatever the mount does)."""

    def __init__(self, rng, plain, exclude=()):
        self.rng = rng
        self.plain = plain
        self.info = {}              # slot -> "path flags" (for reports)
        self.flags = {}             # slot -> flags
        excluded = set()
        for c in exclude:
            excluded.update(OP_CLASSES[c])
        self.longname = "longname" not in exclude
        self.weights = [(k, w) for k, w in DIFF_WEIGHTS.items()
                        if k not in excluded]
        self.names = [k for k, _ in self.weights]
        self.cum = []
        t = 0
        for _, w in self.weights:
            t += w
            self.cum.append(t)

    def pick_file(self):
        r = self.rng.random()
        if self.longname and r < 0.01:
            return self.rng.choice([LONG, "sub/" + LONG])
        if r < 0.04:
            return self.rng.choice(DIRS)
        return self.rng.choice(FILES)

    def pick_dir(self):
        r = self.rng.random()
        if r < 0.06:
            return "."
        if self.longname and r < 0.07:
            return LONG
        if r < 0.12:
            return self.rng.choice(FILES)
        return self.rng.choice(DIRS)

    def data(self, big=True):
        r = self.rng.random()
        if r < 0.6:
            n = self.rng.randint(1, 256)
        elif r < 0.85 or not big:
            n = self.rng.randint(257, 16384)
        elif r < 0.96:
            n = self.rng.randint(16385, 200000)
        else:
            n = self.rng.randint(200001, 1200000)
        return ["D", self.rng.getrandbits(32), n]

    def plain_size(self, slot):
        try:
            return os.fstat(self.plain.fds[slot]).st_size
        except (OSError, KeyError):
            return 0

    def plain_is_dir(self, slot):
        try:
            return stat.S_ISDIR(os.fstat(self.plain.fds[slot]).st_mode)
        except (OSError, KeyError):
            return False

    def offset(self, size):
        r = self.rng.random()
        if r < 0.15:
            return 0
        if r < 0.45:
            return self.rng.randint(0, max(size, 0))
        if r < 0.65:
            return size
        if r < 0.8:
            return size + self.rng.randint(1, 5000)
        if r < 0.97:
            b = self.rng.choice([4096, 65536, 1 << 20, 4 << 20])
            return max(0, b + self.rng.randint(-64, 64))
        return self.rng.randint(0, 5 << 20)

    def next(self):
        """The next operation (a JSON-able list) and a note for reports."""
        rng = self.rng
        while True:
            name = self.names[_bisect(self.cum, rng.random() * self.cum[-1])]
            slots = sorted(self.plain.fds)
            if name in FD_OPS and not slots:
                name = "open"
            if name == "open" and len(slots) >= MAX_SLOTS:
                name = "close"
            op = self._make(name, slots)
            if op is not None:
                return op

    def _make(self, name, slots):
        rng = self.rng
        if name == "open":
            slot = min(set(range(MAX_SLOTS)) - set(self.plain.fds))
            flags = _weighted(rng, OPEN_FLAGS)
            mode = rng.choice([0o644, 0o600, 0o640])
            path = self.pick_file()
            self.info[slot] = f"{path} {'|'.join(flags)}"
            self.flags[slot] = flags
            return ["open", path, flags, mode, slot]
        if name in FD_OPS:
            slot = self.pick_slot(name, slots)
            size = self.plain_size(slot)
        if name == "close":
            return ["close", slot]
        if name == "read":
            return ["read", slot, rng.choice([1, 100, 4096, 70000, 1 << 20])]
        if name == "pread":
            return ["pread", slot, rng.choice([1, 100, 4096, 70000, 1 << 20]),
                    self.offset(size)]
        if name == "write":
            return ["write", slot, self.data()]
        if name == "pwrite":
            return ["pwrite", slot, self.data(), self.offset(size)]
        if name == "lseek":
            if self.plain_is_dir(slot):
                # Directory offsets are cookies of the file system (ext4's
                # htree answers SEEK_END with LLONG_MAX): a legitimate
                # difference, so only rewinding is compared.
                return ["lseek", slot, 0, 0]
            whence = rng.choice([0, 0, 1, 2])
            off = self.offset(size) if whence == 0 else rng.randint(-100, 100)
            return ["lseek", slot, off, whence]
        if name == "ftruncate":
            return ["ftruncate", slot, self.trunc_size(size)]
        if name == "truncate":
            return ["truncate", self.pick_file(), self.trunc_size(4096)]
        if name == "fsync":
            return ["fsync", slot]
        if name == "fstat":
            return ["fstat", slot]
        if name == "stat":
            return ["stat", rng.choice([self.pick_file, self.pick_dir])()]
        if name == "listdir":
            return ["listdir", self.pick_dir()]
        if name == "readfile":
            return ["readfile", self.pick_file()]
        if name == "rename":
            if rng.random() < 0.8:
                a, b = self.pick_file(), self.pick_file()
            else:
                a, b = self.pick_dir(), rng.choice([self.pick_dir,
                                                    self.pick_file])()
            return ["rename", a, b]
        if name == "link":
            return ["link", self.pick_file(), self.pick_file()]
        if name == "unlink":
            return ["unlink", self.pick_file()]
        if name == "mkdir":
            return ["mkdir", self.pick_dir(), rng.choice([0o755, 0o700])]
        if name == "rmdir":
            return ["rmdir", self.pick_dir()]
        if name == "cfr":
            src, dst = rng.choice(slots), rng.choice(slots)
            count = rng.choice([1, 100, 4096, 65536, 300000])
            if rng.random() < 0.3:
                return ["cfr", src, dst, count, None, None]
            return ["cfr", src, dst, count,
                    self.offset(self.plain_size(src)),
                    self.offset(self.plain_size(dst))]
        if name == "mmapw":
            if size == 0:
                return None
            off = rng.randint(0, size - 1)
            d = self.data(big=False)
            d[2] = max(1, min(d[2], size - off))
            return ["mmapw", slot, off, d]
        raise AssertionError(name)

    def pick_slot(self, name, slots):
        """Mostly a descriptor the operation can work on (reads on readable
        ones, writes on writable ones, mmap on O_RDWR ones), sometimes any
        (EBADF, EACCES, EISDIR are compared too)."""
        want = {"read": ("O_RDONLY", "O_RDWR"), "pread": ("O_RDONLY", "O_RDWR"),
                "write": ("O_WRONLY", "O_RDWR"), "pwrite": ("O_WRONLY", "O_RDWR"),
                "ftruncate": ("O_WRONLY", "O_RDWR"), "mmapw": ("O_RDWR",)
                }.get(name)
        if want and self.rng.random() < 0.85:
            good = [s for s in slots if self.flags.get(s, [""])[0] in want]
            if good:
                return self.rng.choice(good)
        return self.rng.choice(slots)

    def trunc_size(self, size):
        r = self.rng.random()
        if r < 0.25:
            return 0
        if r < 0.55:
            return self.rng.randint(0, max(size, 1))
        if r < 0.8:
            return size + self.rng.randint(1, 70000)
        if r < 0.97:
            b = self.rng.choice([4096, 65536, 1 << 20, 4 << 20])
            return max(0, b + self.rng.randint(-64, 64))
        return -1                                   # EINVAL

    def note(self, op):
        if op[0] in FD_OPS and op[1] in self.info:
            s = f"s{op[1]}: {self.info[op[1]]}"
            if op[0] == "cfr" and op[2] in self.info:
                s += f" -> s{op[2]}: {self.info[op[2]]}"
            return s
        return ""


def _bisect(cum, x):
    for i, c in enumerate(cum):
        if x < c:
            return i
    return len(cum) - 1


def _weighted(rng, items):
    total = sum(w for _, w in items)
    x = rng.random() * total
    for v, w in items:
        x -= w
        if x < 0:
            return v
    return items[-1][0]


# -- journal (the controller's view of a worker) ----------------------------------


class Journal:
    """Worker side: one line before and one after each operation.  The
    controller tails it to detect hangs and to show a crashed or hung
    worker's last operations.  Lines are written unbuffered (a worker that
    dies leaves everything it wrote)."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def begin(self, idx, text):
        os.write(self.fd, f"B {idx} {time.monotonic():.3f} {text}\n".encode(
            errors="replace"))

    def end(self, idx, text):
        os.write(self.fd, f"E {idx} {text}\n".encode(errors="replace"))

    def note(self, text):
        os.write(self.fd, f"N {text}\n".encode(errors="replace"))


class JournalReader:
    def __init__(self, path):
        self.path = path
        self.off = 0
        self.buf = b""
        self.last = collections.deque(maxlen=HISTORY)
        self.open_op = None          # (idx, t, text) begun, not ended
        self.count = 0

    def poll(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.off)
                chunk = f.read()
        except OSError:
            return
        self.off += len(chunk)
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            kind, _, rest = line.partition(" ")
            if kind == "B":
                idx, t, text = (rest.split(" ", 2) + ["", ""])[:3]
                self.open_op = (idx, float(t), text)
            elif kind == "E":
                idx, _, res = rest.partition(" ")
                if self.open_op is not None:
                    self.last.append(f"#{self.open_op[0]} {self.open_op[2]}"
                                     f" -> {res}")
                    self.count += 1
                self.open_op = None
            elif kind == "N":
                self.last.append(f"-- {rest}")

    def tail(self):
        lines = list(self.last)
        if self.open_op is not None:
            lines.append(f"#{self.open_op[0]} {self.open_op[2]} -> "
                         "(no result: still running)")
        return "\n".join("    " + ln for ln in lines)


# -- worker: diff phase ------------------------------------------------------------


def replay_hint(spec):
    return (f"python3 tests/integration/randomops.py --mount MOUNT --plain "
            f"PLAIN --seed {spec['seed']} --procs {spec['procs']} --only-proc "
            f"{spec['proc']} --ops {{n}}"
            + (f" --exclude {','.join(spec['exclude'])}" if spec['exclude']
               else ""))


def copy_tree(src, dst):
    """Copy src (a mount directory) to dst (plain): files, directories,
    modes, and hard links (names that share an inode in src share one in
    dst).  Names of unlinked-but-open remote files are hidden already."""
    if os.path.lexists(dst):
        shutil.rmtree(dst)
    os.mkdir(dst)
    seen = {}
    for top, dirs, files in os.walk(src):
        dirs.sort()
        rel_top = os.path.relpath(top, src)
        dtop = os.path.join(dst, rel_top) if rel_top != "." else dst
        for d in dirs:
            os.mkdir(os.path.join(dtop, d))
        for f in sorted(files):
            s, t = os.path.join(top, f), os.path.join(dtop, f)
            st = os.lstat(s)
            if not stat.S_ISREG(st.st_mode):
                continue
            if st.st_nlink > 1 and st.st_ino in seen:
                os.link(seen[st.st_ino], t)
                continue
            with open(s, "rb") as fi, open(t, "wb") as fo:
                shutil.copyfileobj(fi, fo, 1 << 20)
            os.chmod(t, stat.S_IMODE(st.st_mode))
            seen[st.st_ino] = t
    # directory modes last (a 0o700 directory is still writable by root,
    # but keep the order anyway)
    for top, dirs, _ in os.walk(src):
        rel_top = os.path.relpath(top, src)
        for d in dirs:
            st = os.lstat(os.path.join(top, d))
            os.chmod(os.path.join(dst, rel_top, d), stat.S_IMODE(st.st_mode))
    # and src's own: a worker may have removed its directory and made it
    # again with mode 0o700 (rmdir('.') and mkdir('.') act on it), and a
    # copy left at the umask's mode showed as a mismatch of stat('.') in
    # every later phase (seeds 740872253 and, likely, 83203121)
    os.chmod(dst, stat.S_IMODE(os.lstat(src).st_mode))


def worker_diff(spec):
    """Run spec['ops'] random (or given) operations on both sides."""
    seed, proc, phase = spec["seed"], spec["proc"], spec["phase"]
    rng = random.Random(f"randomops/{seed}/{proc}/{phase}")
    plain, mount = Side(spec["plain"]), Side(spec["mount"])
    journal = Journal(spec["journal"])
    gen = DiffGen(rng, plain, spec["exclude"])
    given = spec.get("oplist")
    deadline = spec["deadline"]
    keep_going = spec.get("keep_going", 1)
    history = collections.deque(maxlen=HISTORY)
    findings, ops_log = [], []
    epoch_start = 0
    n_ops = len(given) if given is not None else spec["ops"]
    i = 0

    def do(idx, op, note):
        text = show_op(op, note)
        journal.begin(idx, text)
        rp = normal(plain.run(op))
        rm = normal(mount.run(op))
        journal.end(idx, show_result(rm) if rp == rm else
                    f"MISMATCH plain: {show_result(rp)} mount: {show_result(rm)}")
        history.append((idx, text, rp, rm))
        return rp, rm

    def mismatch(idx, op, note, rp, rm):
        hist = "\n".join(
            f"    #{j} {t} -> " + (show_result(a) if a == b else
                                   f"plain {show_result(a)} / mount {show_result(b)}")
            for j, t, a, b in history)
        detail = explain(rp, rm)
        text = (f"MISMATCH seed={seed} proc={proc} phase={phase} op#{idx}: "
                f"{show_op(op, note)}\n"
                f"  plain: {show_result(rp)}\n  mount: {show_result(rm)}\n"
                + (detail + "\n" if detail else "")
                + f"  last {len(history)} ops of proc {proc}:\n{hist}\n"
                + ("  replay: " + replay_hint(spec).format(n=idx + 1) + "\n"
                   if given is None and epoch_start == 0 and phase == 0
                   else ""))
        findings.append({"kind": "mismatch", "proc": proc, "phase": phase,
                         "idx": idx, "op": op, "text": text,
                         "sig": signature(op, rp, rm),
                         # the whole list from the start (replayed with
                         # the same resynchronisations by the shrinker)
                         "ops": list(ops_log) if spec.get("want_ops") or
                         epoch_start == 0 else None})

    def resync():
        """After a mismatch (with --keep-going): forget the descriptors and
        make the plain tree a copy of the mount's, then go on."""
        plain.close_all()
        mount.close_all()
        gen.info.clear()
        gen.flags.clear()
        journal.begin(-1, "resync (copy mount tree to plain)")
        try:
            copy_tree(mount.root, plain.root)
        except OSError as e:
            journal.end(-1, f"err {ename(e.errno)}")
            findings.append({
                "kind": "resync", "proc": proc, "phase": phase, "idx": i,
                "sig": ["resync", ename(e.errno)],
                "ops": list(ops_log) if spec.get("want_ops") else None,
                "text": f"RESYNC FAILED seed={seed} proc={proc} phase={phase}"
                        f" after op#{i}: copying the mount's tree: {e} (a "
                        f"name the mount lists cannot be used)"})
            return False
        journal.end(-1, "ok")
        return True
        journal.note("resync")

    stopped = "ops"
    while i < n_ops:
        if time.monotonic() > deadline:
            stopped = "time"
            break
        if given is not None:
            op, note = given[i], ""
        else:
            op = gen.next()
            note = gen.note(op)
        ops_log.append(op)
        rp, rm = do(i, op, note)
        if rp != rm:
            mismatch(i, op, note, rp, rm)
            if len(findings) >= keep_going:
                stopped = "mismatch"
                break
            if not resync():
                stopped = "mismatch"
                break
            epoch_start = len(ops_log)
        i += 1

    if stopped != "mismatch":
        # The end: close what is open (results compared), then the trees.
        for slot in sorted(plain.fds):
            op = ["close", slot]
            ops_log.append(op)
            rp, rm = do(i, op, gen.note(op))
            if rp != rm:
                mismatch(i, op, gen.note(op), rp, rm)
            i += 1
        mount.close_all()
        op = ["tree"]
        ops_log.append(op)
        rp, rm = do(i, op, "")
        if rp != rm:
            mismatch(i, op, "", rp, rm)
    return {"proc": proc, "phase": phase, "ops": i, "stopped": stopped,
            "findings": findings,
            "oplist": ops_log if spec.get("want_ops") and not given
            else None}


def signature(op, rp, rm):
    """What kind of mismatch: op name, both outcomes (ok or the errno),
    and for two different successes what differs (the stat fields, byte
    string length or content).  Groups repeats in reports and is what a
    shrunk sequence must still produce."""
    def kind(r):
        return r[1] if r[0] == "err" else r[0]
    sig = [op[0], kind(rp), kind(rm)]
    if rp[0] == rm[0] == "ok":
        a, b = rp[1], rm[1]
        if isinstance(a, dict) and isinstance(b, dict):
            if op[0] == "tree":
                sig.append("tree")
            else:
                sig.append("+".join(k for k in sorted(set(a) | set(b))
                                    if a.get(k) != b.get(k)))
        elif isinstance(a, (bytes, bytearray)) and \
                isinstance(b, (bytes, bytearray)):
            sig.append("length" if len(a) != len(b) else "content")
        else:
            sig.append("value")
    return sig


# -- worker: fault phase -----------------------------------------------------------


class FileModel:
    """What is known of one file written during the fault phase.

    val/known: its content as far as acknowledged (known[i] == 1: byte i
    was acknowledged -- written, then fsync() or close() returned 0 -- and
    nothing since made it uncertain).  pending: writes and truncations not
    yet acknowledged, in order; a failed truncation, fsync() or close()
    makes their range uncertain.

    A pwrite() that reported an error has an uncertain outcome, as on NFS
    (docs/design.md, "Write-back"): its bytes may land, even after later
    operations, or not.  They are kept in `failed` (offset, bytes): the
    file may hold, at any byte, the acknowledged value or the byte of a
    failed write covering it, and may be longer than the acknowledged size
    by such bytes (the gap zero-filled) -- but never other bytes, and never
    lack an acknowledged one."""

    def __init__(self, fid, name):
        self.fid = fid
        self.names = {name}
        self.val = bytearray()
        self.known = bytearray()
        self.size = 0
        self.size_known = True
        self.pending = []          # ("w", off, data) ("wfail", off, data)
                                   # ("t", size) ("tfail", size)
        self.failed = []           # (off, data) of failed pwrite()s
        self.acks = 0
        self.writer = None         # the one writable slot, if any

    def _grow(self, n):
        if len(self.val) < n:
            self.known.extend(b"\0" * (n - len(self.val)))
            self.val.extend(b"\0" * (n - len(self.val)))

    def _apply(self, e, certain):
        kind = e[0]
        if kind == "w" and certain:
            off, d = e[1], e[2]
            if self.size_known and off > self.size:
                self._grow(off)
                self.known[self.size:off] = b"\1" * (off - self.size)
                self.val[self.size:off] = b"\0" * (off - self.size)
            self._grow(off + len(d))
            self.val[off:off + len(d)] = d
            self.known[off:off + len(d)] = b"\1" * len(d)
            if self.size_known:
                self.size = max(self.size, off + len(d))
        elif kind == "wfail":
            # Landed or not, each byte: the acknowledged one stays known
            # and the failed bytes are the only alternative (see above).
            self.failed.append((e[1], e[2]))
        elif kind == "w":
            off = e[1]
            n = len(e[2])
            self._grow(off + n)
            self.known[off:off + n] = b"\0" * n
            if self.size_known and off + n > self.size:
                self.size_known = False
        elif kind == "t" and certain:
            n = e[1]
            if self.size_known and n > self.size:
                self._grow(n)
                self.val[self.size:n] = b"\0" * (n - self.size)
                self.known[self.size:n] = b"\1" * (n - self.size)
            del self.val[n:]
            del self.known[n:]
            self._grow(n)
            self.size, self.size_known = n, True
        else:                       # "t" uncertain, "tfail"
            n = e[1]
            self._grow(n)
            del self.known[n:]
            self.known.extend(b"\0" * (len(self.val) - len(self.known)))
            self.size_known = False

    def resolve(self, ok):
        """fsync()/close() returned 0 (ok) or failed."""
        for e in self.pending:
            self._apply(e, ok and e[0] in ("w", "t"))
        self.pending = []
        if ok:
            self.acks += 1

    def acked(self):
        """(val, mask) of the bytes acknowledged and not touched since by a
        pending write or truncation: what any read must return."""
        mask = bytearray(self.known)
        for e in self.pending:
            if e[0] in ("w", "wfail"):
                n = len(e[2])
                mask[e[1]:e[1] + n] = b"\0" * len(mask[e[1]:e[1] + n])
            else:
                mask[e[1]:] = b"\0" * len(mask[e[1]:])
        return self.val, mask

    def view(self):
        """(val, known, size or None) with pending writes overlaid: what a
        read must see now (read-your-writes)."""
        m = FileModel(self.fid, "")
        m.val, m.known = bytearray(self.val), bytearray(self.known)
        m.size, m.size_known = self.size, self.size_known
        for e in self.pending:
            m._apply(e, e[0] in ("w", "t"))
        if m.failed_end() > m.size:
            m.size_known = False
        return m.val, m.known, (m.size if m.size_known else None)

    def failed_end(self):
        """Where the furthest failed write ends (0 without one)."""
        return max((off + len(d) for off, d in self.failed), default=0)


def masked_diff(a, b, known):
    """First index i < len(known) with known[i] and a[i] != b[i] (a, b at
    least as long as known), or -1."""
    n = len(known)
    if n == 0:
        return -1
    xa = int.from_bytes(a[:n], "little")
    xb = int.from_bytes(b[:n], "little")
    xm = int.from_bytes(known, "little") * 0xff
    d = (xa ^ xb) & xm
    if d == 0:
        return -1
    return ((d & -d).bit_length() - 1) // 8


def failed_at(failed, i, b):
    """Is b the byte at file offset i of one of the failed writes?"""
    return any(off <= i < off + len(d) and d[i - off] == b
               for off, d in failed)


def first_unexplained(data, val, known, start, end, failed, base=0):
    """First i in [start, end) where data[i] is known and differs from
    val[i] and no failed write explains it (file offset base + i), or -1.
    Fast when nothing differs; byte by byte only after a difference."""
    i = masked_diff(data[start:end], val[start:end], known[start:end])
    if i < 0:
        return -1
    for j in range(start + i, end):
        if known[j] and data[j] != val[j] and \
                not failed_at(failed, base + j, data[j]):
            return j
    return -1


def check_content(data, val, known, size, failed=()):
    """None if data agrees with what is known, else a description.

    failed: (offset, bytes) of writes whose call reported an error (an
    uncertain outcome): at any byte their byte may replace the
    acknowledged one, and they may make the file longer than `size`
    (the gap reads as zeros).  Nothing else may differ."""
    end = max((off + len(d) for off, d in failed), default=0)
    if size is not None and len(data) != size:
        if not size < len(data) <= end:
            return f"size {len(data)}, expected {size}" + (
                f" (or up to {end} with failed writes)" if end > size
                else "")
        for j in range(size, len(data)):
            if data[j] and not failed_at(failed, j, data[j]):
                return (f"byte {j} beyond the acknowledged size {size} is "
                        f"{data[j]:#x}: neither a failed write's nor zero")
    last = len(known) - 1
    while last >= 0 and not known[last]:
        last -= 1
    if last >= len(data):
        return (f"acknowledged bytes up to {last} missing: the file has "
                f"{len(data)} bytes")
    i = first_unexplained(data, val, known, 0, last + 1, failed)
    if i < 0:
        return None
    j = i
    while j <= last and known[j] and data[j] != val[j] and j < i + (1 << 20):
        j += 1
    return (f"bytes {i}..{j} differ from what was acknowledged: got "
            f"{bytes(data[i:min(j, i + 16)])!r}, expected "
            f"{bytes(val[i:min(j, i + 16)])!r}" +
            (" (and from the failed writes)" if failed else ""))


class FaultGen:
    """Operations for the fault phase: mount only, files with unique names
    in p<I>/fault/, at most one writable descriptor per file, so that
    every acknowledged byte is known exactly."""

    def __init__(self, rng, base):
        self.rng = rng
        self.base = base
        self.n = 0
        self.files = {}            # name -> FileModel
        self.slots = {}            # slot -> (fd, FileModel, writable)
        self.dead = []             # models without a name (for stats)

    def newname(self, prefix="f"):
        self.n += 1
        return f"fault/{prefix}{self.n}"

    def next(self):
        rng = self.rng
        r = rng.random()
        free = sorted(set(range(MAX_SLOTS)) - set(self.slots))
        if (r < 0.12 or not self.files) and free:
            return ["create", self.newname(), rng.choice(["excl", "trunc"]),
                    free[0]]
        if r < 0.20 and free and self.files:
            name = rng.choice(sorted(self.files))
            m = self.files[name]
            if m.writer is None and rng.random() < 0.7:
                return ["openw", name, rng.random() < 0.15, free[0]]
            return ["openr", name, free[0]]
        writers = [s for s, (_, _, w) in self.slots.items() if w]
        if r < 0.50 and writers:
            s = rng.choice(writers)
            m = self.slots[s][1]
            off = rng.randint(0, m.view()[2] or len(m.val) or 0) \
                if rng.random() < 0.7 else rng.randint(0, 300000)
            n = rng.choice([rng.randint(1, 300), rng.randint(300, 33000),
                            rng.randint(1, 140000)])
            return ["pwrite", s, ["D", rng.getrandbits(32), n], off]
        if r < 0.60 and self.slots:
            return ["pread", rng.choice(sorted(self.slots)),
                    rng.choice([100, 4096, 1 << 20]),
                    rng.choice([0, 0, rng.randint(0, 100000)])]
        if r < 0.68 and self.slots:
            return ["fsync", rng.choice(sorted(self.slots))]
        if r < 0.78 and self.slots:
            return ["close", rng.choice(sorted(self.slots))]
        if r < 0.81 and writers:
            return ["ftruncate", rng.choice(writers),
                    rng.randint(0, 200000)]
        names = sorted(self.files)
        if r < 0.86 and names:
            a = rng.choice(names)
            if rng.random() < 0.3 and len(names) > 1:
                b = rng.choice([n for n in names if n != a])
                if self.files[b].writer is not None or \
                        self.files[b] is self.files[a]:
                    b = self.newname()
            else:
                b = self.newname()
            return ["rename", a, b]
        if r < 0.89 and names:
            return ["link", rng.choice(names), self.newname()]
        if r < 0.92 and names:
            return ["unlink", rng.choice(names)]
        if r < 0.95:
            return ["mkdir", self.newname("dir")]
        if r < 0.98:
            return ["listdir", "fault"]
        return ["stat", rng.choice(names) if names else "fault"]

    # -- applying one op to the mount, updating the model ------------------------

    def run(self, op):
        """Returns (result, finding text or None)."""
        base = self.base
        name = op[0]
        try:
            if name == "create":
                fl = os.O_RDWR | os.O_CREAT | (os.O_EXCL if op[2] == "excl"
                                               else os.O_TRUNC)
                fd = os.open(os.path.join(base, op[1]), fl | os.O_CLOEXEC,
                             0o644)
                m = FileModel(self.n, op[1])
                self.files[op[1]] = m
                m.writer = op[3]
                self.slots[op[3]] = (fd, m, True)
                return ("ok", None), None
            if name in ("openw", "openr"):
                m = self.files[op[1]]
                w = name == "openw"
                fl = (os.O_RDWR | (os.O_TRUNC if op[2] else 0)) if w \
                    else os.O_RDONLY
                slot = op[3] if w else op[2]
                try:
                    fd = os.open(os.path.join(base, op[1]), fl | os.O_CLOEXEC)
                except OSError:
                    if w and op[2]:
                        m.pending.append(("tfail", 0))
                        m.resolve(False)
                    raise
                self.slots[slot] = (fd, m, w)
                if w:
                    m.writer = slot
                    if op[2]:
                        m.pending.append(("t", 0))
                return ("ok", None), None
            if name == "pwrite":
                fd, m, _ = self.slots[op[1]]
                d = data_of(op[2])
                try:
                    n = os.pwrite(fd, d, op[3])
                except OSError:
                    m.pending.append(("wfail", op[3], bytes(d)))
                    raise
                m.pending.append(("w", op[3], d[:n]))
                return ("ok", n), None
            if name == "pread":
                fd, m, _ = self.slots[op[1]]
                d = os.pread(fd, op[2], op[3])
                return ("ok", d), self.check_read(
                    m, d, op[2], op[3], lambda at: cut_by_error(fd, at))
            if name == "fsync":
                fd, m, _ = self.slots[op[1]]
                try:
                    os.fsync(fd)
                except OSError:
                    m.resolve(False)
                    raise
                m.resolve(True)
                return ("ok", None), None
            if name == "close":
                fd, m, w = self.slots.pop(op[1])
                if w:
                    m.writer = None
                try:
                    os.close(fd)
                except OSError:
                    if w:
                        m.resolve(False)
                    raise
                if w:
                    m.resolve(True)
                return ("ok", None), None
            if name == "ftruncate":
                fd, m, _ = self.slots[op[1]]
                try:
                    os.ftruncate(fd, op[2])
                except OSError:
                    m.pending.append(("tfail", op[2]))
                    raise
                m.pending.append(("t", op[2]))
                return ("ok", None), None
            if name == "rename":
                a, b = op[1], op[2]
                ma, mb = self.files[a], self.files.get(b)
                try:
                    os.rename(os.path.join(base, a), os.path.join(base, b))
                except OSError:
                    self.forget(a)
                    if mb is not None:
                        self.forget(b)
                    raise
                if mb is not None:
                    self.forget(b)
                del self.files[a]
                ma.names.discard(a)
                ma.names.add(b)
                self.files[b] = ma
                return ("ok", None), None
            if name == "link":
                m = self.files[op[1]]
                os.link(os.path.join(base, op[1]), os.path.join(base, op[2]))
                m.names.add(op[2])
                self.files[op[2]] = m
                return ("ok", None), None
            if name == "unlink":
                try:
                    os.unlink(os.path.join(base, op[1]))
                finally:
                    self.forget(op[1])
                return ("ok", None), None
            if name == "mkdir":
                os.mkdir(os.path.join(base, op[1]))
                return ("ok", None), None
            if name == "listdir":
                return ("ok", len(os.listdir(os.path.join(base, op[1])))), None
            if name == "stat":
                return ("ok", facts(os.lstat(os.path.join(base, op[1])))), None
            raise AssertionError(op)
        except OSError as e:
            return ("err", ename(e.errno)), None

    def forget(self, name):
        """name's content or existence is uncertain (or gone): drop it."""
        m = self.files.pop(name, None)
        if m is not None:
            m.names.discard(name)

    def check_read(self, m, d, n, off, cut=None):
        """(severity, text) when a successful read contradicts the model:
        "corrupt" if it contradicts acknowledged bytes nothing has touched
        since, "ryw" if only bytes written (write() returned) but not yet
        acknowledged (read-your-writes); None if it agrees.  cut(at): True
        when a read at `at` fails -- a read that came back short because
        of an I/O error after it had copied some bytes (what read(2) does
        on any file system: the pages the kernel held, then the error),
        which claims nothing about the bytes it did not return."""
        val, mask = m.acked()
        kn = mask[off:off + n]
        j = kn.find(b"\1", len(d))
        short = [j] if j >= 0 else []
        # A failed write's bytes may have landed (FileModel).
        i = first_unexplained(d, val[off:off + len(d)], kn[:len(d)], 0,
                              len(d), m.failed, off)
        if i >= 0:
            return ("corrupt", f"byte {off + i}: read {d[i]:#x}, acknowledged "
                               f"{val[off + i]:#x}")
        if short:
            if cut and cut(off + len(d)):
                return None
            return ("corrupt", f"read {len(d)} bytes at {off}: acknowledged "
                               f"byte {off + short[0]} missing")
        val, known, size = m.view()
        if size is not None:
            want = max(0, min(n, size - off))
            if len(d) != want:
                return ("ryw", f"read {len(d)} bytes at {off}, expected {want}"
                               f" (file size {size} after writes that "
                               f"returned)")
        kn = known[off:off + len(d)]
        i = first_unexplained(d, val[off:off + len(kn)], kn, 0, len(kn),
                              m.failed, off)
        if i >= 0:
            return ("ryw", f"byte {off + i}: read {d[i]:#x}, written "
                           f"{val[off + i]:#x}")
        return None

    def close_all(self):
        out = []
        for s in sorted(self.slots):
            out.append((["close", s], self.run(["close", s])[0]))
        return out

    def expectations(self, outdir):
        """Write what must be in the sandbox: {name: files} index."""
        idx = {}
        k = 0
        for name, m in sorted(self.files.items()):
            if not m.acks:
                continue     # never acknowledged: existence not promised
            k += 1
            vp = os.path.join(outdir, f"{k}.val")
            kp = os.path.join(outdir, f"{k}.known")
            fp = os.path.join(outdir, f"{k}.failed")
            Path(vp).write_bytes(bytes(m.val))
            Path(kp).write_bytes(bytes(m.known))
            Path(fp).write_text(json.dumps([[off, d.hex()]
                                            for off, d in m.failed]))
            idx[name] = {"val": vp, "known": kp, "failed": fp,
                         "size": m.size if m.size_known else None,
                         "acked": sum(m.known)}
        return idx


def cut_by_error(fd, at):
    """Does reading fd at `at` fail (EIO during an outage, say)?"""
    try:
        os.pread(fd, 1, at)
    except OSError:
        return True
    return False


def worker_fault(spec):
    seed, proc, phase = spec["seed"], spec["proc"], spec["phase"]
    rng = random.Random(f"randomops-fault/{seed}/{proc}/{phase}")
    base = spec["mount"]
    journal = Journal(spec["journal"])
    # A worker started late on a loaded machine may meet the first fault
    # here (seed 590975898: EIO, then no result the controller could
    # count): keep trying, as its operations do.
    while True:
        try:
            os.makedirs(os.path.join(base, "fault"), exist_ok=True)
            break
        except OSError:
            if time.monotonic() >= spec["deadline"] or \
                    os.path.exists(spec["stop_file"]):
                raise
            time.sleep(0.1)
    gen = FaultGen(rng, base)
    errs = collections.Counter()
    findings, ryw = [], []
    stale = 0
    i = 0
    while time.monotonic() < spec["deadline"] and \
            not os.path.exists(spec["stop_file"]):
        op = gen.next()
        journal.begin(i, show_op(op))
        r, bad = gen.run(op)
        journal.end(i, show_result(r))
        if r[0] == "err":
            errs[f"{op[0]}:{r[1]}"] += 1
            # During an outage most operations fail at once: do not spin.
            time.sleep(0.02)
        if bad:
            sev, why = bad
            if sev == "corrupt":
                stale += 1
                if stale <= 3:
                    findings.append({
                        "kind": "stale-read", "proc": proc, "phase": phase,
                        "idx": i, "sig": ["stale-read"],
                        "text": f"STALE READ seed={seed} proc={proc} phase="
                                f"{phase} op#{i}: {show_op(op)}: {why} (a "
                                f"write acknowledged by fsync()/close() is "
                                f"not seen by this descriptor)"})
            else:
                ryw.append(f"op#{i}: {show_op(op)}: {why}")
        i += 1
    for op, r in gen.close_all():
        journal.begin(i, show_op(op))
        journal.end(i, show_result(r))
        if r[0] == "err":
            errs[f"close-at-end:{r[1]}"] += 1
        i += 1
    outdir = os.path.join(os.path.dirname(spec["journal"]),
                          f"expect-p{proc}-{phase}")
    os.makedirs(outdir, exist_ok=True)
    if stale > 3:
        findings[-1]["text"] += (f"\n  ... and {stale - 3} more stale reads "
                                 f"of acknowledged data in this phase")
    warnings = []
    if ryw:
        # Reported, not failed: the diff phases check read-your-writes
        # exactly (and fail); here a failed push may legitimately have
        # made written-but-unacknowledged bytes uncertain.
        warnings.append(f"proc {proc} phase {phase}: {len(ryw)} read(s) did "
                        f"not return bytes written (write() had returned, "
                        f"not yet acknowledged), e.g.\n      "
                        + "\n      ".join(ryw[:3]))
    return {"proc": proc, "phase": phase, "ops": i, "stopped": "stop",
            "findings": findings, "errors": dict(errs), "warnings": warnings,
            "expect": gen.expectations(outdir)}


def failed_writes(e):
    """The failed writes of an expectations entry: [(offset, bytes)]."""
    return [(off, bytes.fromhex(h))
            for off, h in json.loads(Path(e["failed"]).read_text())]


def worker_verify(spec):
    """Read every acknowledged file through the mount and check it."""
    journal = Journal(spec["journal"])
    findings = []
    i = 0
    for name, e in sorted(spec["expect"].items()):
        journal.begin(i, f"verify {name}")
        p = os.path.join(spec["mount"], name)
        try:
            with open(p, "rb") as f:
                data = f.read()
            bad = check_content(data, Path(e["val"]).read_bytes(),
                                Path(e["known"]).read_bytes(), e["size"],
                                failed_writes(e))
        except OSError as ex:
            bad = f"cannot read: {ename(ex.errno)}"
        journal.end(i, bad or "ok")
        if bad:
            findings.append({"kind": "lost", "proc": spec["proc"],
                             "phase": spec["phase"],
                             "text": f"LOST (through the mount) {name}: {bad}"})
        i += 1
    return {"proc": spec["proc"], "phase": spec["phase"], "ops": i,
            "stopped": "done", "findings": findings}


def worker_reseed(spec):
    journal = Journal(spec["journal"])
    journal.begin(0, f"reseed: copy {spec['mount']} to {spec['plain']}")
    copy_tree(spec["mount"], spec["plain"])
    journal.end(0, "ok")
    return {"proc": spec["proc"], "phase": spec["phase"], "ops": 1,
            "stopped": "done", "findings": []}


def worker_mkdirs(spec):
    journal = Journal(spec["journal"])
    for i, d in enumerate(spec["dirs"]):
        journal.begin(i, f"mkdir {d} (removing what a former run left)")
        if os.path.lexists(d):
            shutil.rmtree(d)
        os.makedirs(d)
        journal.end(i, "ok")
    return {"proc": spec["proc"], "phase": spec["phase"], "ops": 0,
            "stopped": "done", "findings": []}


def worker_probe(spec):
    """stat the mount root and list it (health check after faults)."""
    journal = Journal(spec["journal"])
    journal.begin(0, f"probe {spec['mount']}")
    os.stat(spec["mount"])
    os.listdir(spec["mount"])
    journal.end(0, "ok")
    return {"proc": spec["proc"], "phase": spec["phase"], "ops": 1,
            "stopped": "done", "findings": []}


WORKERS = {"diff": worker_diff, "fault": worker_fault, "verify": worker_verify,
           "reseed": worker_reseed, "mkdirs": worker_mkdirs,
           "probe": worker_probe}


def worker_main(spec_path):
    spec = json.loads(Path(spec_path).read_text())
    try:
        res = WORKERS[spec["mode"]](spec)
    except OSError as e:
        import traceback
        tb = "".join(traceback.format_exc(limit=-4))
        res = {"proc": spec.get("proc"), "phase": spec.get("phase"),
               "stopped": "error", "error": f"{ename(e.errno)}: {e}",
               "findings": [{"kind": "error", "proc": spec.get("proc"),
                             "phase": spec.get("phase"),
                             "text": f"ERROR seed={spec.get('seed')} worker "
                                     f"{spec['mode']} p{spec.get('proc')} "
                                     f"failed: {e}\n{tb}"}]}
    tmp = spec["result"] + ".tmp"
    Path(tmp).write_text(json.dumps(res))
    os.rename(tmp, spec["result"])
    return 0 if not res["findings"] else 1


# -- controller ---------------------------------------------------------------------


@dataclass
class Config:
    mount: str                 # directory in the mount (workers use p<I>)
    plain: str                 # the plain directory (same layout)
    seed: int = 0
    procs: int = 4
    ops: int = 1000
    time_limit: float = 60.0   # seconds per diff phase
    op_timeout: float = OP_TIMEOUT
    workdir: str = ""
    exclude: list = field(default_factory=list)
    keep_going: int = 1        # findings per worker before it stops
    only_proc: int = -1
    backing: str = ""          # the sandbox's real directory that --mount
                               # shows (leak checks; optional)
    want_ops: bool = False     # keep every worker's op list (for --shrink)
    phase: int = 0             # the first diff phase's number
    python: str = sys.executable
    log: object = None         # callable(str) for progress lines


@dataclass
class Report:
    seed: int
    findings: list = field(default_factory=list)
    phases: list = field(default_factory=list)   # summaries
    hung: list = field(default_factory=list)     # pids of abandoned workers
    warnings: list = field(default_factory=list)  # reported, not failed

    @property
    def ok(self):
        return not self.findings

    def text(self):
        out = [f"randomops seed={self.seed}: "
               + ("ok" if self.ok else f"{len(self.findings)} finding(s)")]
        out += ["  " + p for p in self.phases]
        out += ["  warning: " + w for w in self.warnings]
        seen = set()
        for f in self.findings:
            # In full the first finding of each kind (signature); repeats
            # (other workers, later ops) in one line.
            sig = tuple(f.get("sig") or ()) or None
            if sig is not None and sig in seen:
                out.append(f["text"].splitlines()[0] + "  (same kind as "
                           "above)")
                continue
            seen.add(sig)
            out.append(f["text"].rstrip())
        return "\n".join(out)


class Controller:
    def __init__(self, cfg):
        self.cfg = cfg
        if not cfg.workdir:
            cfg.workdir = tempfile.mkdtemp(prefix="randomops-")
        os.makedirs(cfg.workdir, exist_ok=True)
        self.report = Report(cfg.seed)
        self.n = 0
        self.log = cfg.log or (lambda s: print(s, flush=True))

    def procs(self):
        if self.cfg.only_proc >= 0:
            return [self.cfg.only_proc]
        return list(range(self.cfg.procs))

    def spec(self, mode, proc, phase, **kw):
        self.n += 1
        w = self.cfg.workdir
        tag = f"{self.n:03d}-{mode}-p{proc}-ph{phase}"
        s = {"mode": mode, "seed": self.cfg.seed, "procs": self.cfg.procs,
             "proc": proc, "phase": phase, "exclude": self.cfg.exclude,
             "journal": os.path.join(w, tag + ".journal"),
             "result": os.path.join(w, tag + ".result"),
             "spec": os.path.join(w, tag + ".spec")}
        s.update(kw)
        return s

    def run_workers(self, specs, limit, schedule=(), stop_file=None,
                    stop_after_schedule=0.0):
        """Start one process per spec; wait at most `limit` seconds (plus
        op_timeout for the last op); meanwhile run `schedule` [(t, label,
        fn)] and, once done, create stop_file after stop_after_schedule
        seconds.  Returns the workers' results (None for hung/crashed)."""
        cfg = self.cfg
        t0 = time.monotonic()
        procs = []
        for s in specs:
            for f in (s["journal"], s["result"]):   # never a stale one
                if os.path.exists(f):
                    os.unlink(f)
            Path(s["spec"]).write_text(json.dumps(s))
            out = open(s["journal"] + ".out", "wb")
            p = subprocess.Popen([cfg.python, os.path.abspath(__file__),
                                  "--worker", s["spec"]],
                                 stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT,
                                 start_new_session=True)
            out.close()
            procs.append((s, p, JournalReader(s["journal"])))
        results = [None] * len(specs)
        done = [False] * len(specs)
        sched = sorted(schedule, key=lambda x: x[0])
        sched_done_at = None if sched else t0
        hard = t0 + limit + cfg.op_timeout + 10
        while not all(done):
            now = time.monotonic()
            while sched and now - t0 >= sched[0][0]:
                _, label, fn = sched.pop(0)
                self.log(f"  [{now - t0:5.1f}s] fault: {label}")
                try:
                    fn()
                except Exception as e:  # noqa: BLE001 - reported
                    self.finding("error", None, None,
                                 f"fault action {label!r} failed: {e}")
                if not sched:
                    sched_done_at = time.monotonic()
            if stop_file and sched_done_at is not None and \
                    now - sched_done_at >= stop_after_schedule and \
                    not os.path.exists(stop_file):
                Path(stop_file).write_text("stop\n")
            for k, (s, p, jr) in enumerate(procs):
                if done[k]:
                    continue
                jr.poll()
                rc = p.poll()
                if rc is not None:
                    jr.poll()
                    done[k] = True
                    results[k] = self._collect(s, p, jr, rc)
                    continue
                if jr.open_op is not None and \
                        now - jr.open_op[1] > cfg.op_timeout:
                    done[k] = True
                    self._hang(s, p, jr, now - jr.open_op[1])
                elif now > hard:
                    done[k] = True
                    self._hang(s, p, jr, None)
            time.sleep(0.1)
        return results

    def _collect(self, s, p, jr, rc):
        try:
            res = json.loads(Path(s["result"]).read_text())
        except (OSError, ValueError):
            out = ""
            try:
                out = Path(s["journal"] + ".out").read_text(errors="replace")
            except OSError:
                pass
            how = (f"killed by signal {signal.Signals(-rc).name}" if rc < 0
                   else f"exited {rc} without a result")
            self.finding("crash", s["proc"], s["phase"],
                         f"CRASH seed={s['seed']} proc={s['proc']} phase="
                         f"{s['phase']} ({s['mode']}): worker {how}\n"
                         f"  last ops:\n{jr.tail()}\n"
                         f"  output: {out[-2000:]}")
            return None
        for f in res["findings"]:
            self.report.findings.append(f)
        self.report.warnings += res.get("warnings", [])
        return res

    def _hang(self, s, p, jr, secs):
        what = (f"blocked {secs:.0f}s in one operation" if secs is not None
                else "did not finish in time")
        self.finding("hang", s["proc"], s["phase"],
                     f"HANG seed={s['seed']} proc={s['proc']} phase="
                     f"{s['phase']} ({s['mode']}): worker pid {p.pid} {what}\n"
                     f"  operation: {jr.open_op[2] if jr.open_op else '?'}\n"
                     f"  last ops:\n{jr.tail()}")
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        self.report.hung.append(p.pid)

    def finding(self, kind, proc, phase, text):
        self.report.findings.append({"kind": kind, "proc": proc,
                                     "phase": phase, "text": text})

    # -- phases -----------------------------------------------------------------

    def setup(self):
        """Create p<I> on both sides (empty; they must not exist)."""
        cfg = self.cfg
        for i in self.procs():
            pp = os.path.join(cfg.plain, f"p{i}")
            if os.path.lexists(pp):
                shutil.rmtree(pp)
            os.makedirs(pp)
        s = self.spec("mkdirs", -1, 0, dirs=[os.path.join(cfg.mount, f"p{i}")
                                              for i in self.procs()])
        res = self.run_workers([s], 30)[0]
        if res is None or res["findings"]:
            self.finding("setup", None, None,
                         f"SETUP: cannot make empty p<I> directories in "
                         f"{cfg.mount} (see above); the run stops here")
            return False
        return True

    def check_leaks(self, phase, results, wait=3.0):
        """No `.sbx-silly.*` file may stay in the sandbox once every
        descriptor is closed (the workers have exited).  Needs cfg.backing.
        Not those of a fault phase either: a file whose last close came
        while the sandbox was unreachable cannot be removed then (NFS
        leaves .nfs* files so), but the daemon's flusher tries again once
        the sandbox answers, within 5 s (docs/design.md, "Files removed
        while open"), so after a fault phase the wait covers that."""
        if not self.cfg.backing:
            return
        if phase > 0:
            wait = max(wait, 8.0)
        left = {}
        # Hidden files of a directory removed while they were open move to
        # the sandbox's root (docs/design.md, "Files removed while open"),
        # the backing's parent: they must go at their last close too.
        root = os.path.dirname(os.path.abspath(self.cfg.backing))
        deadline = time.monotonic() + wait
        while True:
            left = {i: silly_files(os.path.join(self.cfg.backing, f"p{i}"))
                    for i in self.procs()}
            left = {i: v for i, v in left.items() if v}
            at_root = sorted(n for n in os.listdir(root)
                             if n.startswith(".sbx-silly."))
            if (not left and not at_root) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if at_root:
            self.report.findings.append({
                "kind": "leak", "proc": None, "phase": phase,
                "sig": ["leak"], "idx": 0, "ops": None,
                "text": f"LEAK seed={self.cfg.seed} phase={phase}: hidden "
                        f"files left in the sandbox's root {root} after "
                        f"every descriptor was closed: {', '.join(at_root)}"})
        by_proc = {r["proc"]: r for r in results if r}
        for i, names in sorted(left.items()):
            r = by_proc.get(i) or {}
            self.report.findings.append({
                "kind": "leak", "proc": i, "phase": phase,
                "sig": ["leak"], "idx": (r.get("ops") or 1) - 1,
                "ops": r.get("oplist"),
                "text": f"LEAK seed={self.cfg.seed} proc={i} phase={phase}: "
                        f"hidden files left in the sandbox after every "
                        f"descriptor was closed: {', '.join(names)}"})

    def diff_phase(self, phase):
        cfg = self.cfg
        t = time.monotonic()
        deadline = t + cfg.time_limit
        specs = [self.spec("diff", i, phase, ops=cfg.ops, deadline=deadline,
                           keep_going=cfg.keep_going, want_ops=cfg.want_ops,
                           mount=os.path.join(cfg.mount, f"p{i}"),
                           plain=os.path.join(cfg.plain, f"p{i}"))
                 for i in self.procs()]
        res = self.run_workers(specs, cfg.time_limit)
        n = sum(r.get("ops", 0) for r in res if r)
        secs = time.monotonic() - t
        stops = collections.Counter(r["stopped"] if r else "hang/crash"
                                    for r in res)
        line = (f"diff phase {phase}: {n} ops by {len(specs)} procs in "
                f"{secs:.1f}s ({n / max(secs, 0.001):.0f} ops/s); ended by: "
                + ", ".join(f"{k} x{v}" for k, v in sorted(stops.items())))
        self.report.phases.append(line)
        self.log("  " + line)
        return res

    def fault_phase(self, phase, schedule, heal, limit=60.0, settle=1.0):
        """Mount-only operations while schedule's faults happen; then heal()
        and stop; returns the expectations of every worker."""
        cfg = self.cfg
        t = time.monotonic()
        stop_file = os.path.join(cfg.workdir, f"stop-{phase}")
        specs = [self.spec("fault", i, phase, deadline=t + limit,
                           stop_file=stop_file,
                           mount=os.path.join(cfg.mount, f"p{i}"))
                 for i in self.procs()]
        sched = list(schedule)
        last = max((x[0] for x in sched), default=0.0)
        sched.append((last + 0.2, "heal: wait until the mount answers",
                      lambda: self.wait_healthy(heal)))
        res = self.run_workers(specs, limit, sched, stop_file, settle)
        # (A worker that failed reports its error, and no count.)
        n = sum(r.get("ops", 0) for r in res if r)
        errs = collections.Counter()
        for r in res:
            if r:
                errs.update(r.get("errors", {}))
        acked = sum(len(r.get("expect", {})) for r in res if r)
        line = (f"fault phase {phase}: {n} ops in {time.monotonic() - t:.1f}s,"
                f" {acked} acknowledged files to verify; errors: "
                + (", ".join(f"{k} x{v}" for k, v in errs.most_common(12))
                   or "none"))
        self.report.phases.append(line)
        self.log("  " + line)
        return res

    def wait_healthy(self, heal=None, within=60.0):
        if heal:
            heal()
        t = time.monotonic()
        while time.monotonic() - t < within:
            s = self.spec("probe", -1, -1, mount=self.cfg.mount)
            res = self.run_workers([s], 20)
            if res[0] is not None and not res[0]["findings"]:
                return True
            # a failed probe is not a finding by itself (yet): drop it
            self.report.findings = [f for f in self.report.findings
                                    if f.get("proc") != -1
                                    or f["kind"] == "hang"]
            time.sleep(0.5)
        self.finding("hang", None, None,
                     f"the mount did not answer within {within}s after heal")
        return False

    def verify(self, phase, fault_results, backing=None):
        """Every acknowledged file must be in the mount and, if `backing`
        (the sandbox's real directory, the agent root) is given, there."""
        cfg = self.cfg
        specs = []
        for r in fault_results:
            if not r or "expect" not in r:
                continue
            i = r["proc"]
            exp = {os.path.join(f"p{i}", k): v for k, v in r["expect"].items()}
            specs.append(self.spec("verify", i, phase, expect=exp,
                                   mount=cfg.mount))
            if backing is not None:
                for name, e in sorted(exp.items()):
                    p = os.path.join(backing, name)
                    try:
                        data = Path(p).read_bytes()
                        bad = check_content(data, Path(e["val"]).read_bytes(),
                                            Path(e["known"]).read_bytes(),
                                            e["size"], failed_writes(e))
                    except OSError as ex:
                        bad = f"cannot read: {ename(ex.errno)}"
                    if bad:
                        self.finding("lost", i, phase,
                                     f"LOST (in the sandbox's directory) "
                                     f"{name}: {bad}")
        before = len(self.report.findings)
        sandbox_bad = {f["text"].split(" ")[5].rstrip(":")
                       for f in self.report.findings
                       if f["kind"] == "lost"
                       and "(in the sandbox's directory)" in f["text"]}
        self.run_workers(specs, 60)
        # A file the sandbox holds intact but the mount cannot read is not
        # a lost write but the mount's view after the outage: "mount-stale"
        # (a failure too; docs/design.md, "Known defects", has its fixed
        # causes).  A file the sandbox itself lacks or has wrong stays
        # "lost".
        if backing is not None:
            for f in self.report.findings[before:]:
                if f["kind"] == "lost" and "(through the mount)" in f["text"]:
                    name = f["text"].split(" ")[4].rstrip(":")
                    if name not in sandbox_bad and "cannot read" in f["text"]:
                        f["kind"] = "mount-stale"
        n = sum(len(r.get("expect", {})) for r in fault_results if r)
        self.report.phases.append(f"verify after phase {phase}: {n} files")

    def reseed(self, phase):
        cfg = self.cfg
        specs = [self.spec("reseed", i, phase,
                           mount=os.path.join(cfg.mount, f"p{i}"),
                           plain=os.path.join(cfg.plain, f"p{i}"))
                 for i in self.procs()]
        self.run_workers(specs, 60)


def run(cfg, faults=None, backing=None, alive=None, fault_rounds=1,
        heal=None):
    """The whole run: setup, diff phase 0, then per fault round: fault
    phase (schedule `faults`: [(seconds, label, fn)]), heal, verify against
    the mount and `backing`, alive() check, reseed, diff phase.  Returns a
    Report.  `backing` (or cfg.backing): the sandbox's own directory
    that cfg.mount shows (for a remote sandbox, below the agent root)."""
    if backing:
        cfg.backing = str(backing)
    backing = cfg.backing or None
    c = Controller(cfg)
    c.log(f"randomops: seed={cfg.seed} procs={cfg.procs} ops={cfg.ops} "
          f"time_limit={cfg.time_limit}s mount={cfg.mount} plain={cfg.plain} "
          f"workdir={cfg.workdir}")
    if not c.setup():
        return c.report
    phase = cfg.phase
    c.check_leaks(phase, c.diff_phase(phase))
    if alive:
        _alive(c, alive, "after diff phase %d" % phase)
    if faults:
        for _ in range(fault_rounds):
            if c.report.hung:
                break
            phase += 1
            res = c.fault_phase(phase, faults, heal)
            if not c.wait_healthy(None):
                break
            c.verify(phase, res, backing)
            if alive:
                _alive(c, alive, "after fault phase %d" % phase)
            if c.report.hung:
                break
            c.reseed(phase)
            phase += 1
            c.check_leaks(phase, c.diff_phase(phase))
            if alive:
                _alive(c, alive, "after diff phase %d" % phase)
    return c.report


def silly_files(root):
    out = []
    for top, dirs, files in os.walk(root):
        for n in files + dirs:
            if n.startswith(".sbx-silly."):
                out.append(os.path.relpath(os.path.join(top, n), root))
    return sorted(out)


def _alive(c, alive, when):
    try:
        why = alive()
    except Exception as e:  # noqa: BLE001 - reported
        why = f"check raised {e!r}"
    if why:
        c.finding("crash", None, None, f"DAEMON {when}: {why}")


def standalone_alive(mount):
    """A check for the standalone run: the mount is still a FUSE mount and
    answers a stat (in a child process, so that a hung daemon cannot hang
    this one)."""
    def check():
        m = os.path.abspath(mount)
        while m != "/" and not _is_fuse_mountpoint(m):
            m = os.path.dirname(m)
        if m == "/":
            return f"no FUSE mount above {mount} any more"
        try:
            r = subprocess.run([sys.executable, "-c",
                                "import os,sys; os.stat(sys.argv[1])", m],
                               timeout=30, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            return f"stat {m} hangs"
        if r.returncode != 0:
            return f"stat {m} fails: {r.stderr.strip()[-300:]}"
        return None
    return check


def _is_fuse_mountpoint(path):
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            mp = pre.split(" ")[4].replace("\\040", " ")
            if mp == path and post.startswith("fuse"):
                return True
    return False


# -- shrinking ----------------------------------------------------------------------


def shrink(cfg, finding, max_trials=400, log=print, tag="0"):
    """Delta debugging of a diff-phase finding's operation list: the
    smallest list (1-minimal, within max_trials) whose replay in fresh
    directories still gives a mismatch with the same signature (op name,
    plain outcome, mount outcome).  Returns (ops, report text) or None."""
    ops = finding.get("ops")
    if not ops:
        return None
    ops = ops[:finding["idx"] + 1] if len(ops) > finding["idx"] else ops
    sig = finding["sig"]
    c = Controller(Config(mount=cfg.mount, plain=cfg.plain, seed=cfg.seed,
                          procs=cfg.procs, workdir=os.path.join(
                              cfg.workdir, f"shrink-{tag}"),
                          op_timeout=cfg.op_timeout,
                          python=cfg.python, log=lambda s: None))
    trials = [0]
    last_text = [finding["text"]]

    def fails(cand):
        trials[0] += 1
        k = trials[0]
        d_m = os.path.join(cfg.mount, f"shrink-{cfg.seed}-{tag}-{k}")
        d_p = os.path.join(cfg.plain, f"shrink-{cfg.seed}-{tag}-{k}")
        if os.path.lexists(d_p):
            shutil.rmtree(d_p)
        os.makedirs(d_p)
        r = c.run_workers([c.spec("mkdirs", -1, 0, dirs=[d_m])], 30)[0]
        if r is None or r["findings"]:
            raise RuntimeError(f"cannot make an empty {d_m} for a trial")
        s = c.spec("diff", finding["proc"], 0, oplist=cand, ops=len(cand),
                   deadline=time.monotonic() + 120, keep_going=1000,
                   mount=d_m, plain=d_p)
        res = c.run_workers([s], 120)[0]
        if c.report.hung:
            raise RuntimeError("a shrink trial hung: " + "\n".join(
                f["text"] for f in c.report.findings if f["kind"] == "hang"))
        if res is None:
            return False
        if sig == ["leak"]:
            b = os.path.join(cfg.backing, os.path.basename(d_m))
            t_end = time.monotonic() + 2.0
            while time.monotonic() < t_end:
                left = silly_files(b)
                if not left:
                    return False
                time.sleep(0.2)
            last_text[0] = (f"LEAK: {', '.join(left)} left in "
                            f"{b} after the replay")
            return True
        for f in res["findings"]:
            if f.get("sig") == sig:
                last_text[0] = f["text"]
                return True
        return False

    if not fails(ops):
        if not fails(ops):
            log(f"  shrink: proc {finding['proc']}'s {len(ops)} ops do not "
                f"reproduce the mismatch alone (timing or concurrency)")
            return None
    n = 2
    while len(ops) >= 2 and trials[0] < max_trials:
        chunk = max(1, len(ops) // n)
        removed = False
        for start in range(0, len(ops), chunk):
            cand = ops[:start] + ops[start + chunk:]
            if cand and fails(cand):
                ops = cand
                n = max(n - 1, 2)
                removed = True
                break
            if trials[0] >= max_trials:
                break
        if not removed:
            if chunk == 1:
                break
            n = min(len(ops), n * 2)
    # the minimal list ends with the failing op
    log(f"  shrink: {len(finding['ops'])} -> {len(ops)} ops "
        f"in {trials[0]} trials")
    return ops, last_text[0]


def format_ops(ops):
    """One line per op; an open into a slot still open closes that
    descriptor first (shrinking removes closes), which is noted."""
    out, open_slots = [], set()
    for op in ops:
        note = ""
        if op[0] == "open":
            if op[4] in open_slots:
                note = f"  # closes the previous s{op[4]} first"
            open_slots.add(op[4])
        elif op[0] == "close":
            open_slots.discard(op[1])
        out.append(f"    {show_op(op)}{note}")
    return "\n".join(out)


# -- command line -------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Differential random file operations: a mount against a "
                    "plain directory (see the module docstring).")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--mount", help="a directory inside the mount")
    ap.add_argument("--plain", help="a plain directory on the host")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--ops", type=int, default=1000,
                    help="operations per process")
    ap.add_argument("--time-limit", type=float, default=60.0,
                    help="seconds (wall clock) for the run's operations")
    ap.add_argument("--op-timeout", type=float, default=OP_TIMEOUT,
                    help="an operation blocked longer is a HANG")
    ap.add_argument("--only-proc", type=int, default=-1,
                    help="run only this process's sequence")
    ap.add_argument("--keep-going", type=int, default=1,
                    help="findings per process before it stops (after each "
                         "the plain tree is resynchronised from the mount)")
    ap.add_argument("--exclude", default="",
                    help="operation classes to leave out: "
                         + ",".join(sorted(OP_CLASSES)))
    ap.add_argument("--workdir", default="",
                    help="journals and results (default: a new temp dir)")
    ap.add_argument("--backing", default="",
                    help="the sandbox's own directory that --mount shows "
                         "(the agent root's or worktree's copy): checks "
                         "that no hidden .sbx-silly.* file is left behind")
    ap.add_argument("--shrink", action="store_true",
                    help="minimise each mismatch's operation list")
    ap.add_argument("--replay", help="run a JSON operation list (as printed "
                                     "by --shrink) as process --only-proc")
    a = ap.parse_args(argv)
    if a.worker:
        return worker_main(a.worker)
    if not a.mount or not a.plain:
        ap.error("--mount and --plain are required")
    exclude = [x for x in a.exclude.split(",") if x]
    for x in exclude:
        if x not in OP_CLASSES:
            ap.error(f"unknown class {x!r} (known: {', '.join(OP_CLASSES)})")
    seed = a.seed if a.seed is not None else random.randrange(1, 10 ** 9)
    print(f"randomops seed: {seed}", flush=True)
    cfg = Config(mount=a.mount, plain=a.plain, seed=seed, procs=a.procs,
                 ops=a.ops, time_limit=a.time_limit, op_timeout=a.op_timeout,
                 workdir=a.workdir, exclude=exclude, keep_going=a.keep_going,
                 only_proc=a.only_proc, backing=a.backing,
                 want_ops=a.shrink)
    if a.replay:
        ops = json.loads(Path(a.replay).read_text())
        c = Controller(cfg)
        proc = max(a.only_proc, 0)
        d_m, d_p = (os.path.join(a.mount, f"replay-{seed}"),
                    os.path.join(a.plain, f"replay-{seed}"))
        if os.path.lexists(d_p):
            shutil.rmtree(d_p)
        os.makedirs(d_p)
        c.run_workers([c.spec("mkdirs", -1, 0, dirs=[d_m])], 30)
        c.run_workers([c.spec("diff", proc, 0, oplist=ops, ops=len(ops),
                              deadline=time.monotonic() + a.time_limit,
                              keep_going=a.keep_going, mount=d_m,
                              plain=d_p)], a.time_limit)
        if a.backing:
            b = os.path.join(a.backing, os.path.basename(d_m))
            t_end = time.monotonic() + 2.0
            left = silly_files(b)
            while left and time.monotonic() < t_end:
                time.sleep(0.2)
                left = silly_files(b)
            if left:
                c.finding("leak", proc, 0, f"LEAK: {', '.join(left)} left in "
                                           f"{b} after the replay")
        rep = c.report
        print(rep.text() if rep.findings else f"replay of {len(ops)} ops: ok")
        return 0 if rep.ok else 1
    rep = run(cfg, alive=standalone_alive(a.mount))
    print(rep.text(), flush=True)
    if a.shrink:
        done = set()
        for f in list(rep.findings):
            if not f.get("ops") or not f.get("sig"):
                continue
            if tuple(f["sig"]) in done:
                continue          # one minimal sequence per kind of finding
            done.add(tuple(f["sig"]))
            print(f"shrinking proc {f['proc']} op#{f['idx']} "
                  f"({' / '.join(f['sig'])}) ...", flush=True)
            try:
                r = shrink(cfg, f, tag=str(len(done)))
            except RuntimeError as e:
                print(f"  shrink stopped: {e}", flush=True)
                continue
            if r:
                ops, text = r
                p = os.path.join(cfg.workdir, "min-" +
                                 "-".join(f["sig"]) + ".json")
                Path(p).write_text(json.dumps(ops))
                print(f"  minimal sequence ({len(ops)} ops; replay: "
                      f"--replay {p} --only-proc {f['proc']}):\n"
                      f"{format_ops(ops)}\n{text}", flush=True)
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
